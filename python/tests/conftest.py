"""Fixtures: embedded fabrics on the emulated device (host memory standing in for GPUs, so a lease's device
pointers are host addresses and NumPy reads them directly)."""

import pytest

import vfabric

# One emulated GPU of 16 frames of 64 KiB, no headroom and no eviction before it is full: the frames a test's
# regions take are the frames it chose, so it can lay out a fragmented device on purpose.
SMALL = """
[cluster]
name = "small"
[device]
backend = "emulated"
emulated_gpus = 1
emulated_gpu_memory = "64MiB"
[memory]
page_size = "64KiB"
gpu_budget = "1MiB"
host_arena = "4MiB"
headroom_percent = 0
readahead = "0"
high_watermark_percent = 100
low_watermark_percent = 100
[[node]]
name = "local"
"""


@pytest.fixture
def fabric():
    """The default embedded fabric (the built-in local configuration), on the emulated device in CI."""
    f = vfabric.Fabric()
    if f.device_kind != "emulated":
        pytest.skip("these tests read device memory from the host: they need the emulated device")
    return f


@pytest.fixture
def small(tmp_path):
    """An embedded fabric with one emulated GPU of 16 pages of 64 KiB."""
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return vfabric.Fabric(str(path))
