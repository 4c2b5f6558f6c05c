"""Type stubs of vfabric._native, the Rust extension module (PyO3) that the vfabric package re-exports."""

import os
import sys
from types import TracebackType
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Type, Union

if sys.version_info >= (3, 12):
    from collections.abc import Buffer as _Buffer
else:
    _Buffer = Any

__version__: str

_Device = str
"""A device name: "gpu0", "gpu1", ..., or "host"."""
_Mode = Literal["r", "w", "read", "write"]
_Priority = Literal["low", "normal", "high"]
_Compression = Literal["none", "lz4", "zstd", "fp8-bf16", "fp8-f32", "int8-bf16", "int8-f32"]
_DType = Any
"""An element type: a name ("uint8", "float32", ...), a NumPy dtype or scalar type, or a PyTorch dtype."""
_Shape = Union[int, Sequence[int]]

class FabricError(RuntimeError):
    """Base class of every error the fabric raises."""

class OutOfMemory(FabricError):
    """A device has no room, even after evicting every page that may be evicted."""

class QuotaExceeded(FabricError):
    """A tenant's quota on a tier would be exceeded."""

class InvalidSize(FabricError):
    """A region of zero bytes, or of more pages than a region may have."""

class OutOfBounds(FabricError):
    """A byte range beyond the end of its region or of its lease."""

class InvalidAddress(FabricError):
    """A region handle that names no region of the fabric."""

class UseAfterFree(FabricError):
    """A region used after it was freed."""

class PermissionDenied(FabricError):
    """The caller's tenant may not do this: another tenant's region, another tenant's name, or an operator's call."""

class DoubleFree(FabricError):
    """A region freed twice."""

class LeasedElsewhere(FabricError):
    """Pages leased in a way that excludes this call (written elsewhere, or read while a write is asked)."""

class DeviceUnavailable(FabricError):
    """A device this node does not have, or that failed."""

class ReadOnlyLease(FabricError):
    """A write through a lease that only allows reading."""

class UnknownLease(FabricError):
    """A lease that is not, or no longer, held."""

class PeerDead(FabricError):
    """A node the call depends on stopped answering."""

class Unavailable(FabricError):
    """What the call needs cannot be reached now: a replicated region's standby copy, or nodes enough for its replicas."""

class Stalled(FabricError):
    """The node's copies (a GPU's, a drive's) stopped making progress: calls that move pages fail until they finish."""

class NetworkError(FabricError):
    """The network failed: binding, connecting, a stream, TLS, the local socket."""

class ProtocolError(FabricError):
    """A peer (or the node's agent) broke the protocol."""

class ChecksumError(FabricError):
    """Page bytes arrived with a checksum that does not match: nothing was written."""

class ConfigError(FabricError):
    """The cluster configuration is not usable, or a setting the call needs is missing."""

class DeviceError(FabricError):
    """The device layer failed (a CUDA call, a page move)."""

class LaunchError(FabricError):
    """A job's launch (its launcher's variables, the rendezvous of its ranks) failed."""

class RegionMoved(FabricError):
    """The region's pages moved to another node faster than the call could follow them."""

class InternalError(FabricError):
    """A fault of the fabric itself (a bug)."""

class LeaseInUse(FabricError):
    """A lease released while arrays or tensors made from it are still alive."""

class NotContiguous(FabricError):
    """A view over pages of a lease that do not sit one after the other on the device."""

class Region:
    """A region of the fabric's address space: a name, not memory.

    Returned by `alloc`; passed to every other call. Regions compare equal and hash alike when they name the
    same allocation. `to_tuple()` / `Region.from_tuple()` (and pickle) carry one to another process.
    """

    def __init__(self, addr: int, nbytes: int, page_size: int, slot: int, generation: int) -> None:
        """Rebuilds a region from `to_tuple()`'s five integers."""
    def to_tuple(self) -> Tuple[int, int, int, int, int]:
        """The region as `(addr, nbytes, page_size, slot, generation)`: what another process needs to name it."""
    @classmethod
    def from_tuple(cls, parts: Tuple[int, int, int, int, int]) -> "Region":
        """The region a `to_tuple()` describes. Raises `ValueError` for a tuple no region could have."""
    def __reduce__(self) -> Tuple[Type["Region"], Tuple[int, int, int, int, int]]:
        """Pickles as `Region(*region.to_tuple())`."""
    @property
    def nbytes(self) -> int:
        """The region's size in bytes (whole pages)."""
    @property
    def page_size(self) -> int:
        """The page size of the region, in bytes."""
    @property
    def addr(self) -> int:
        """The region's first global address (the home node in the high 16 bits)."""
    @property
    def node(self) -> int:
        """The node the region was allocated on (its home)."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Reservation:
    """Memory of one device held for a tenant until released: regions allocated with `reservation=` it take
    it, nobody else can. A context manager: leaving the block releases it."""

    @property
    def device(self) -> str:
        """The device whose memory it holds."""
    @property
    def nbytes(self) -> int:
        """Bytes it still holds; 0 once released."""
    @property
    def released(self) -> bool:
        """Whether it was released."""
    def release(self) -> None:
        """Gives back what it still holds (twice: nothing)."""
    def __enter__(self) -> "Reservation": ...
    def __exit__(self, *args: Any) -> bool: ...

class TensorView:
    """A typed, shaped view of a lease's requested bytes, for `numpy.from_dlpack` / `torch.from_dlpack`.

    Every array made from it counts against its lease: the lease cannot be released while one is alive. A view
    of a released lease raises `UnknownLease` when exported. Views of read leases export read-only tensors to
    consumers that understand DLPack 1.0's flags.
    """

    def __dlpack__(
        self,
        stream: Optional[int] = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """Exports the view as a DLPack capsule ("dltensor", or "dltensor_versioned" when max_version >= 1)."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """`(device_type, device_id)` in DLPack's numbering: `(1, 0)` for host memory, `(2, gpu)` for CUDA."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The view's shape."""
    @property
    def dtype(self) -> str:
        """The element type's name."""
    @property
    def nbytes(self) -> int:
        """The bytes the view covers."""
    @property
    def ptr(self) -> int:
        """The address of its first element."""
    @property
    def read_only(self) -> bool:
        """Whether it is a read lease's memory."""

class HostMemory:
    """A lease's host memory as NumPy's array interface: the base of the arrays `Lease.numpy()` makes."""

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """The array interface: address, read-only flag, type string and shape."""

class Lease:
    """A held lease: the right to use a byte range of a region on one device, at fixed addresses, until released.

    Use it as a context manager (`with fabric.acquire(...) as lease:`) or call `release()`. `ptr` is the address
    of the first requested byte; `view()` / `numpy()` give zero-copy arrays over the requested bytes (DLPack).
    Arrays made from a lease must be deleted before it is released.
    """

    def release(self, wait: bool = True) -> None:
        """Releases the lease. Raises `LeaseInUse` (keeping it) while arrays made from it are alive. On a GPU it
        first waits for the work queued there, unless `wait=False` (the caller waited for an event recorded
        after the last kernel that used the pages)."""
    def __enter__(self) -> "Lease": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]] = None,
        exc: Optional[BaseException] = None,
        tb: Optional[TracebackType] = None,
    ) -> bool:
        """Releases the lease if it is still held (see `release`)."""
    def view(self, dtype: Optional[_DType] = None, shape: Optional[_Shape] = None) -> TensorView:
        """A DLPack view of the requested bytes as `dtype` (default uint8) in `shape` (default: 1-D)."""
    def numpy(self, dtype: Optional[_DType] = None, shape: Optional[_Shape] = None) -> Any:
        """A zero-copy NumPy array of the requested bytes (host memory only), writable for a write lease."""
    @property
    def offset(self) -> int:
        """The region offset of the first requested byte."""
    @property
    def nbytes(self) -> int:
        """The requested bytes."""
    @property
    def device(self) -> str:
        """The device the pages are on ("gpu0", "host", ...)."""
    @property
    def mode(self) -> Literal["r", "w"]:
        """"r" or "w"."""
    @property
    def region(self) -> Region:
        """The region."""
    @property
    def ptr(self) -> int:
        """The address of the first requested byte on the device (raises `UnknownLease` once released)."""
    @property
    def pages_offset(self) -> int:
        """The region offset where the leased pages start (the requested offset rounded down to a page)."""
    @property
    def pages_nbytes(self) -> int:
        """The bytes the leased pages cover (whole pages)."""
    @property
    def contiguous(self) -> bool:
        """Whether the leased pages are one run on the device."""
    @property
    def held(self) -> bool:
        """Whether the lease is still held."""
    @property
    def live_views(self) -> int:
        """Arrays and tensors made from this lease that are still alive."""

class FabricBase:
    """The calls every fabric has; see `Fabric` (embedded) and `Client` (attached, from `connect`)."""

    def alloc(
        self,
        nbytes: int,
        device: Optional[_Device] = None,
        priority: _Priority = "normal",
        tenant: int = 0,
        keep: bool = False,
        compression: _Compression = "none",
        reservation: Optional["Reservation"] = None,
    ) -> Region:
        """Allocates a region of `nbytes` bytes (rounded up to whole pages); `compression="lz4"` stores its
        pages compressed on the storage tier where that saves space; the lossy ones ("fp8-bf16", ...) pack an
        array of bf16 or fp32 values on the GPU as its pages leave it (values change within a documented
        bound; its pages cannot be leased in host memory); `reservation` (of this fabric) is memory its pages
        take first on the reservation's device."""
    def reserve(self, nbytes: int, device: Optional[_Device] = None, tenant: int = 0) -> "Reservation":
        """Sets `nbytes` of `device` aside for `tenant` now (evicting as an acquire would); `OutOfMemory` at
        once, saying what can be had, when it cannot be met."""
    def free(self, region: Region) -> None:
        """Frees a region and all its memory (refused while any of its pages is leased)."""
    def write(self, region: Region, offset: int, data: _Buffer) -> None:
        """Copies `data` (bytes, bytearray, memoryview, a C-contiguous array) into the region at `offset`."""
    def read(self, region: Region, offset: int, nbytes: int) -> bytes:
        """Returns `nbytes` bytes of the region from `offset` (pages never written read as zeros)."""
    def read_into(self, region: Region, offset: int, buffer: _Buffer) -> None:
        """Copies `len(buffer)` bytes of the region from `offset` into a writable buffer."""
    def acquire(
        self,
        region: Region,
        offset: int = 0,
        length: Optional[int] = None,
        device: Optional[_Device] = None,
        mode: _Mode = "r",
    ) -> Lease:
        """Leases bytes `offset .. offset + length` (default: to the end) of the region on `device` (default: this
        process's GPU: a rank's local GPU under a launcher, else the first GPU)."""
    def prefetch(self, region: Region, offset: int, length: int, device: _Device) -> None:
        """Starts bringing bytes `offset .. offset + length` of the region to `device` ahead of their use."""
    def write_back(self, region: Region, offset: int, length: int, device: _Device) -> None:
        """Starts copying the pages of the range that only `device` holds to host memory, so that evicting
        them later costs no copy (call it after releasing the lease that wrote them)."""
    def migrate(self, region: Region, device: _Device) -> None:
        """Moves the region to `device` (refused while any of its pages is leased)."""
    def stats(self) -> Dict[str, Any]:
        """The fabric's figures: the directory's and the bytes moved."""
    @property
    def page_size(self) -> int:
        """The page size of the node's regions, in bytes."""
    @property
    def devices(self) -> List[str]:
        """The node's devices: the GPUs ("gpu0", ...), then "host"."""
    @property
    def device_kind(self) -> Literal["cuda", "emulated"]:
        """"cuda" (real GPUs) or "emulated" (host memory standing in for GPUs)."""

class Fabric(FabricBase):
    """The fabric of one node, embedded in this process.

    `config` is a cluster configuration file (TOML); by default the built-in local configuration: this
    machine's GPUs through CUDA, or the emulated device (host memory standing in for two GPUs).
    """

    def __init__(self, config: Optional[Union[str, "os.PathLike[str]"]] = None) -> None: ...

class Client(FabricBase):
    """A process attached to its node's agent (from `connect`): the node's memory mapped here."""

    @property
    def node(self) -> int:
        """The agent's node."""
    @property
    def default_device(self) -> str:
        """The device leases go to when `acquire` names none: a rank's local GPU under a launcher."""
    @property
    def hosts_agent(self) -> bool:
        """Whether this process runs its host's agent (local rank 0 started it): it should leave last."""

def connect(socket: Optional[Union[str, "os.PathLike[str]"]] = None) -> Client:
    """Attaches to the node's agent serving `socket` (default: $VFABRIC_SOCKET, else the job's socket) and maps
    its memory here. Under a launcher (mpirun, Slurm, torchrun), local rank 0 of a job on one host starts the
    agent when none runs (a process of its own, which ends with the rank; VFABRIC_HOST_AGENT=thread runs it in
    the rank's process), and the other ranks wait for it."""

def _serve_host_agent() -> None:
    """Serves the ranks of this host as the agent process their local rank 0 started, until standard input ends."""

def _torch_allocator_start(config: Optional[Union[str, "os.PathLike[str]"]] = None, budget: Optional[int] = None) -> str:
    """Starts the embedded fabric PyTorch's allocator takes memory from (use `vfabric.torch.use_as_allocator`);
    returns its device kind."""

def _torch_allocator_attach(client: Client) -> str:
    """Starts PyTorch's allocator over the node's agent `client` is attached to; returns its device kind."""

def _torch_allocator_stats() -> str:
    """The allocator's figures as JSON ("null" before it starts; use `vfabric.torch.memory_stats`)."""
