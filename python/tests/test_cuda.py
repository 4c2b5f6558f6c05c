"""On real GPUs (skipped elsewhere): PyTorch tensors over leases through DLPack, zero copy, and the release
that waits for PyTorch's kernels. Run on the GPU machine with the release wheel (scripts/python-wheel.sh)."""

import numpy as np
import pytest

import vfabric

torch = pytest.importorskip("torch")


@pytest.fixture
def gpu():
    f = vfabric.Fabric()
    if f.device_kind != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs a GPU: the fabric runs on CUDA and PyTorch sees it")
    return f


def test_torch_tensors_are_the_leased_gpu_memory(gpu):
    n = 2 << 20
    r = gpu.alloc(4 * n, device="gpu0")
    gpu.write(r, 0, np.arange(n, dtype=np.float32))
    with gpu.acquire(r, 0, 4 * n, device="gpu0", mode="w") as lease:
        view = lease.view("float32", (2048, 1024))
        assert view.__dlpack_device__() == (2, 0)
        t = torch.from_dlpack(view)
        assert t.device == torch.device("cuda", 0) and t.shape == (2048, 1024)
        assert t.data_ptr() == lease.ptr
        for _ in range(10):
            t.mul_(2)  # queued on PyTorch's stream; the release waits for them
        del t
    back = np.frombuffer(gpu.read(r, 0, 4 * n), dtype=np.float32)
    np.testing.assert_array_equal(back, np.arange(n, dtype=np.float32) * 1024)


def test_an_unaligned_view_on_the_gpu(gpu):
    page = gpu.page_size
    r = gpu.alloc(3 * page, device="gpu0")
    offset = page + 12345
    with gpu.acquire(r, offset, 4096, device="gpu0", mode="w") as lease:
        t = torch.from_dlpack(lease.view())
        assert t.data_ptr() == lease.ptr and t.numel() == 4096
        t.fill_(7)
        del t
    assert gpu.read(r, offset - 1, 4098) == b"\0" + b"\x07" * 4096 + b"\0"


def test_a_live_tensor_keeps_its_lease(gpu):
    r = gpu.alloc(gpu.page_size, device="gpu0")
    lease = gpu.acquire(r, device="gpu0", mode="w")
    t = torch.from_dlpack(lease.view("int32"))
    with pytest.raises(vfabric.LeaseInUse):
        lease.release()
    t.fill_(-1)
    del lease  # the tensor keeps the lease held
    with pytest.raises(vfabric.LeasedElsewhere):
        gpu.read(r, 0, 4)
    del t
    assert gpu.read(r, 0, 4) == b"\xff" * 4


def test_host_leases_on_a_gpu_machine_are_numpy_arrays(gpu):
    r = gpu.alloc(gpu.page_size, device="host")
    with gpu.acquire(r, 8, 8, device="host", mode="w") as lease:
        assert lease.view().__dlpack_device__() == (1, 0)
        a = lease.numpy("float64")
        a[0] = 2.5
        del a
    assert np.frombuffer(gpu.read(r, 8, 8), dtype=np.float64)[0] == 2.5


def test_regions_move_between_gpus(gpu):
    if "gpu1" not in gpu.devices:
        pytest.skip("needs two GPUs")
    r = gpu.alloc(8 << 20, device="gpu0")
    gpu.write(r, 0, b"\x05" * (8 << 20))
    gpu.migrate(r, "gpu1")
    with gpu.acquire(r, 0, 8 << 20, device="gpu1") as lease:
        t = torch.from_dlpack(lease.view())
        assert t.device == torch.device("cuda", 1)
        assert int(t.sum()) == 5 * (8 << 20)
        del t
