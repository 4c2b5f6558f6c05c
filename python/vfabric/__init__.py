"""vfabric: one address space over the GPUs, host memory and NVMe drives of a cluster.

The fabric places regions of memory on any device and moves their pages where they are needed. From Python:

    import numpy as np
    import vfabric

    fabric = vfabric.Fabric()                   # the embedded fabric of this process
    region = fabric.alloc(64 << 20, device="gpu0")
    fabric.write(region, 0, np.arange(1024, dtype=np.float32))
    with fabric.acquire(region, 0, 4096, device="gpu0", mode="w") as lease:
        array = lease.numpy("float32")          # zero copy (host memory: the emulated device, or "host")
        array *= 2
        del array                               # arrays must go before their lease ends
    fabric.free(region)

`torch.from_dlpack(lease.view("float32"))` gives a CUDA tensor on a real GPU. Every error is a
`vfabric.FabricError` (a `RuntimeError`) of a precise subclass; bad arguments raise `ValueError`.
"""

from vfabric._native import (
    ChecksumError,
    Client,
    ConfigError,
    DeviceError,
    DeviceUnavailable,
    DoubleFree,
    Fabric,
    FabricBase,
    FabricError,
    InternalError,
    InvalidAddress,
    InvalidSize,
    LaunchError,
    Lease,
    LeasedElsewhere,
    LeaseInUse,
    NetworkError,
    NotContiguous,
    OutOfBounds,
    OutOfMemory,
    PeerDead,
    PermissionDenied,
    ProtocolError,
    QuotaExceeded,
    ReadOnlyLease,
    Region,
    RegionMoved,
    Reservation,
    Stalled,
    TensorView,
    Unavailable,
    UnknownLease,
    UseAfterFree,
    __version__,
    connect,
)

__all__ = [
    "ChecksumError",
    "Client",
    "ConfigError",
    "DeviceError",
    "DeviceUnavailable",
    "DoubleFree",
    "Fabric",
    "FabricBase",
    "FabricError",
    "InternalError",
    "InvalidAddress",
    "InvalidSize",
    "LaunchError",
    "Lease",
    "LeaseInUse",
    "LeasedElsewhere",
    "NetworkError",
    "NotContiguous",
    "OutOfBounds",
    "OutOfMemory",
    "PeerDead",
    "PermissionDenied",
    "ProtocolError",
    "QuotaExceeded",
    "ReadOnlyLease",
    "Region",
    "RegionMoved",
    "Reservation",
    "Stalled",
    "TensorView",
    "Unavailable",
    "UnknownLease",
    "UseAfterFree",
    "__version__",
    "connect",
]
