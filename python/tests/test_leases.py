"""Leases: device pointers, zero-copy arrays through DLPack, and the rule that an array never outlives its
lease's memory."""

import gc

import numpy as np
import pytest

import vfabric

# NumPy reads DLPack 1.0 capsules (and so writable arrays) from 2.1 on; before, its DLPack arrays are read-only.
DLPACK_WRITABLE = tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1)


def leases_held(fabric):
    return fabric.stats()["directory"]["leases"]


def test_numpy_from_dlpack_is_zero_copy(fabric):
    r = fabric.alloc(4 << 20, device="gpu0")
    fabric.write(r, 0, np.arange(1 << 20, dtype=np.float32))
    with fabric.acquire(r, 0, 4 << 20, device="gpu0", mode="w") as lease:
        assert (lease.offset, lease.nbytes, lease.device, lease.mode) == (0, 4 << 20, "gpu0", "w")
        view = lease.view("float32")
        assert view.__dlpack_device__() == (1, 0)  # host memory: the emulated GPU
        assert view.shape == (1 << 20,) and view.dtype == "float32" and view.ptr == lease.ptr
        a = np.from_dlpack(view)
        assert a.ctypes.data == lease.ptr  # the lease's memory itself, not a copy
        assert a.flags.writeable == DLPACK_WRITABLE
        np.testing.assert_array_equal(a[:5], [0, 1, 2, 3, 4])
        w = lease.numpy(np.float32, (1024, 1024))  # writable with any NumPy
        assert w.ctypes.data == lease.ptr
        w *= 2  # written through one array...
        assert a[3] == 6  # ...seen through the other
        del a, w
    back = np.frombuffer(fabric.read(r, 0, 4 << 20), dtype=np.float32)
    np.testing.assert_array_equal(back, np.arange(1 << 20, dtype=np.float32) * 2)  # ...and by the fabric


def test_view_of_an_unaligned_offset(fabric):
    r = fabric.alloc(6 << 20, device="gpu0")
    page = fabric.page_size
    offset, length = page + 12345, page  # starts inside page 1, ends inside page 2
    fabric.write(r, offset - 1, b"<" + bytes(range(256)) * (length // 256) + b">")
    with fabric.acquire(r, offset, length, device="gpu0", mode="w") as lease:
        assert lease.pages_offset == page and lease.pages_nbytes == 2 * page
        a = lease.numpy()
        assert a.ctypes.data == lease.ptr  # the requested byte, not the page's first
        assert a.shape == (length,)
        assert a[0] == 0 and a[255] == 255 and a[-1] == 255
        a[:4] = [9, 9, 9, 9]
        del a
    assert fabric.read(r, offset - 1, 6) == b"<\x09\x09\x09\x09\x04"
    assert fabric.read(r, offset + length, 1) == b">"  # the byte after the view is untouched


def test_release_with_a_live_array_raises_and_keeps_the_lease(fabric):
    r = fabric.alloc(2 << 20, device="gpu0")
    lease = fabric.acquire(r, 0, 4096, device="gpu0", mode="w")
    a = lease.numpy()
    with pytest.raises(vfabric.LeaseInUse, match="1 arrays/tensors made from this lease are still alive"):
        lease.release()
    assert lease.held and leases_held(fabric) == 1
    a[:] = 5  # still the lease's memory, still valid
    with pytest.raises(vfabric.LeasedElsewhere):
        fabric.write(r, 0, b"x")  # the write lease still excludes others
    assert lease.live_views == 1
    tail = a[1:]  # a NumPy view of the array keeps it, and so the lease
    del a
    with pytest.raises(vfabric.LeaseInUse):
        lease.release()
    del tail
    assert lease.live_views == 0
    lease.release()
    assert not lease.held and leases_held(fabric) == 0
    assert fabric.read(r, 0, 4097) == b"\x05" * 4096 + b"\0"


def test_exit_with_a_live_array_raises_lease_in_use(fabric):
    r = fabric.alloc(2 << 20)
    with pytest.raises(vfabric.LeaseInUse):
        with fabric.acquire(r, device="gpu0") as lease:
            kept = lease.numpy()
    assert lease.held
    del kept
    lease.release()
    assert leases_held(fabric) == 0


def test_a_collected_lease_stays_held_while_its_array_lives(fabric):
    r = fabric.alloc(2 << 20, device="gpu0")
    fabric.write(r, 0, b"\x01" * 64)
    lease = fabric.acquire(r, 0, 64, device="gpu0", mode="w")
    a = lease.numpy()
    del lease
    gc.collect()
    assert leases_held(fabric) == 1  # the array keeps it
    assert a.sum() == 64  # and its memory is still the region's
    a[:] = 3
    with pytest.raises(vfabric.LeasedElsewhere):
        fabric.read(r, 0, 64)
    del a  # the last view goes: the lease is released
    gc.collect()
    assert leases_held(fabric) == 0
    assert fabric.read(r, 0, 64) == b"\x03" * 64


def test_several_arrays_count_until_the_last_goes(fabric):
    r = fabric.alloc(2 << 20)
    lease = fabric.acquire(r, 0, 1024, device="gpu0", mode="w")
    view = lease.view()
    arrays = [np.from_dlpack(view) for _ in range(3)]
    assert lease.live_views == 3
    arrays.pop()
    with pytest.raises(vfabric.LeaseInUse, match="^2 arrays"):
        lease.release()
    arrays.clear()
    lease.release()


def test_an_unconsumed_capsule_does_not_hold_the_lease(fabric):
    r = fabric.alloc(2 << 20)
    lease = fabric.acquire(r, 0, 1024, device="gpu0")
    view = lease.view()
    capsule = view.__dlpack__()
    versioned = view.__dlpack__(max_version=(1, 0))
    assert lease.live_views == 2
    del capsule, versioned  # never handed to a consumer: their destructors let go
    assert lease.live_views == 0
    lease.release()


def test_legacy_dlpack_consumers_work(fabric):
    class Legacy:
        """A producer without `max_version`: NumPy falls back to the DLPack 0.8 capsule."""

        def __init__(self, view):
            self.view = view

        def __dlpack__(self, stream=None):
            return self.view.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.view.__dlpack_device__()

    r = fabric.alloc(2 << 20)
    fabric.write(r, 0, np.arange(16, dtype=np.int64))
    with fabric.acquire(r, 0, 128, device="gpu0", mode="w") as lease:
        a = np.from_dlpack(Legacy(lease.view("int64", (4, 4))))
        assert a.ctypes.data == lease.ptr
        assert lease.live_views == 1
        assert a[3, 3] == 15 and a.shape == (4, 4)
        del a
        assert lease.live_views == 0


def test_read_leases_give_read_only_arrays(fabric):
    r = fabric.alloc(2 << 20)
    fabric.write(r, 0, b"ro")
    with fabric.acquire(r, 0, 2, device="gpu1", mode="r") as lease:
        for a in [lease.numpy(), np.from_dlpack(lease.view())]:
            assert bytes(a) == b"ro"
            assert not a.flags.writeable
            with pytest.raises(ValueError):
                a[0] = 1
        del a


def test_a_released_lease_makes_no_arrays(fabric):
    r = fabric.alloc(2 << 20)
    lease = fabric.acquire(r, device="host")
    view = lease.view()
    lease.release()
    with pytest.raises(vfabric.UnknownLease):
        np.from_dlpack(view)
    with pytest.raises(vfabric.UnknownLease):
        lease.view()
    with pytest.raises(vfabric.UnknownLease):
        lease.ptr
    with pytest.raises(vfabric.UnknownLease):
        lease.release()
    assert "released" in repr(lease)


def test_host_device_leases_are_host_memory(fabric):
    r = fabric.alloc(2 << 20, device="host")
    with fabric.acquire(r, 100, 8, device="host", mode="w") as lease:
        assert lease.view().__dlpack_device__() == (1, 0)
        a = lease.numpy("uint64")
        a[0] = 0x0102030405060708
        del a
    assert fabric.read(r, 100, 8) == (0x0102030405060708).to_bytes(8, "little")


def test_views_check_dtype_and_shape(fabric):
    r = fabric.alloc(2 << 20)
    with fabric.acquire(r, 0, 24, device="gpu0") as lease:
        assert lease.view("float64").shape == (3,)
        assert lease.view("torch.float32", (2, -1)).shape == (2, 3)  # a PyTorch dtype's name
        assert lease.view(np.dtype("int16"), 12).shape == (12,)
        assert lease.view(np.uint32).dtype == "uint32"
        with pytest.raises(ValueError, match="unsupported dtype"):
            lease.view("complex128")
        assert lease.view("bfloat16").shape == (12,)  # PyTorch has it...
        with pytest.raises(ValueError, match="NumPy has no bfloat16"):
            lease.numpy("bfloat16")  # ...NumPy does not
        with pytest.raises(ValueError, match="holds 8"):
            lease.view("uint8", (2, 4))
        with pytest.raises(ValueError):
            lease.view("uint8", (-2, 12))
        with pytest.raises(BufferError):
            lease.view().__dlpack__(copy=True)
        with pytest.raises(BufferError):
            lease.view().__dlpack__(dl_device=(2, 0))
    with fabric.acquire(r, 0, 10, device="gpu0") as odd:
        with pytest.raises(ValueError, match="whole number"):
            odd.view("int64")


def test_views_across_pages_that_are_apart_raise_not_contiguous(small):
    page = small.page_size
    # Fill the GPU's 16 frames with one-page regions, lease every other one (leased frames never move) and free
    # the rest: the free frames are 8 single frames, so a two-page lease cannot get one run.
    regions = [small.alloc(page, device="gpu0") for _ in range(16)]
    for r in regions:
        small.write(r, 0, b"x")
    pins = [small.acquire(r, device="gpu0") for r in regions[::2]]
    for r in regions[1::2]:
        small.free(r)
    big = small.alloc(2 * page, device="gpu0")
    small.write(big, page - 1, b"ab")
    with small.acquire(big, 0, 2 * page, device="gpu0", mode="w") as lease:
        assert not lease.contiguous
        with pytest.raises(vfabric.NotContiguous, match="not one run"):
            lease.view()
    with small.acquire(big, page - 4, 8, device="gpu0") as across:
        with pytest.raises(vfabric.NotContiguous):
            across.numpy()
    with small.acquire(big, page, 16, device="gpu0") as within:  # one page: one run
        assert bytes(within.numpy()[:1]) == b"b"
    for p in pins:
        p.release()
