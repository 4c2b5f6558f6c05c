"""vfabric from Python in one page: an embedded fabric, a region, bytes in and out, and a lease whose memory
NumPy uses in place.

    python python/examples/quickstart.py

On a machine without a GPU the fabric runs on the emulated device, whose "GPU" memory is host memory, so NumPy
can use a lease on "gpu0" directly. On real GPUs, use `torch.from_dlpack(lease.view("float32"))` for a lease on
a GPU, or lease the region on "host".
"""

import numpy as np

import vfabric


def main() -> None:
    fabric = vfabric.Fabric()  # the built-in local configuration
    print(f"{fabric!r}: devices {fabric.devices}")
    host_memory = fabric.device_kind == "emulated"
    device = "gpu0" if host_memory else "host"

    # A region of 8 MiB on the first GPU; write a million floats into it.
    region = fabric.alloc(8 << 20, device="gpu0")
    values = np.arange(1 << 20, dtype=np.float32)
    fabric.write(region, 0, values)

    # Lease the first 4 MiB for writing and double them in place, through a zero-copy NumPy array.
    with fabric.acquire(region, 0, 4 << 20, device=device, mode="w") as lease:
        array = lease.numpy("float32", (1024, 1024))
        print(f"leased {lease.nbytes} bytes on {lease.device} at {lease.ptr:#x}: an array of {array.shape}")
        array *= 2
        # The array is the lease's memory: it must go before the lease ends (vfabric.LeaseInUse otherwise).
        del array

    back = np.frombuffer(fabric.read(region, 0, 4 << 20), dtype=np.float32)
    assert np.array_equal(back, values * 2), "the fabric sees what the array wrote"

    # Handles travel between processes as five integers.
    handle = region.to_tuple()
    assert vfabric.Region.from_tuple(handle) == region

    # Errors are typed.
    try:
        fabric.read(region, 8 << 20, 1)
    except vfabric.OutOfBounds as e:
        print(f"out of bounds, as expected: {e}")

    fabric.free(region)
    traffic = fabric.stats()["traffic"]
    print(f"done: {traffic['host_io']} bytes written and read by the host, {traffic['fetched']} fetched")


if __name__ == "__main__":
    main()
