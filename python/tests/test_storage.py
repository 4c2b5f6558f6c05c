"""The storage tier from Python: a region larger than the GPU and host memory together written and read back
through it, the tier named where only a GPU or host memory can be refused, a corrupt page on the disk an
exception naming the page, never data, and a lossy region stored in a quarter of the bytes, its values within their bound."""

import pathlib
import re
import shutil

import numpy as np
import pytest

import vfabric

# The tier's file must be on a filesystem with O_DIRECT (tmpfs has none): under the build's target folder.
ROOT = pathlib.Path(__file__).resolve().parents[2] / "target" / "pytest-storage"


@pytest.fixture
def tiered(request):
    folder = ROOT / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = folder / "tiered.toml"
    config.write_text(
        f"""
[cluster]
name = "tiered"
[device]
backend = "emulated"
emulated_gpus = 1
emulated_gpu_memory = "64MiB"
[memory]
page_size = "64KiB"
gpu_budget = "1MiB"
host_arena = "1MiB"
readahead = "0"
[storage]
path = "{folder / 'tier'}"
size = "8MiB"
depth = 16
[[node]]
name = "local"
"""
    )
    # The fabric removes its tier's file when it goes; the folder stays under target/ until the next run.
    return vfabric.Fabric(str(config)), folder / "tier"


def test_a_region_beyond_gpu_and_host_memory_round_trips_through_storage(tiered):
    fabric, tier = tiered
    assert fabric.devices == ["gpu0", "host", "storage"]
    assert tier.exists()
    data = bytes(range(256)) * (6 << 12)  # 6 MiB: the GPU and host memory hold 2 MiB
    region = fabric.alloc(len(data), device="gpu0")
    fabric.write(region, 0, data)
    traffic = fabric.stats()["traffic"]
    assert traffic["to_storage"] >= 4 << 20, traffic
    assert fabric.read(region, 0, len(data)) == data
    with fabric.acquire(region, (5 << 20), 1 << 16, device="gpu0") as lease:
        assert bytes(lease.numpy()) == data[5 << 20 : (5 << 20) + (1 << 16)]
    assert fabric.stats()["traffic"]["from_storage"] > 0
    with pytest.raises(vfabric.DeviceUnavailable, match="storage tier"):
        fabric.acquire(region, 0, 1 << 16, device="storage")


def test_a_page_changed_on_the_disk_is_a_checksum_error(tiered):
    fabric, tier = tiered
    data = b"\x5a" * (6 << 20)
    region = fabric.alloc(len(data), device="gpu0")
    fabric.write(region, 0, data)
    with open(tier, "r+b") as f:  # every slot's bytes change behind the fabric's back
        for slot in range(128):
            f.seek(4096 + slot * (64 << 10) + 10)
            f.write(b"not the page")
    with pytest.raises(vfabric.ChecksumError, match="corrupt"):
        fabric.read(region, 0, len(data))
    # Page by page onto the GPU: those that were in memory come back right; each one whose slot went bad is an
    # error naming that page of the region, and its slot.
    page = 64 << 10
    refused = 0
    for p in range(len(data) // page):
        try:
            with fabric.acquire(region, p * page, page, device="gpu0") as lease:
                assert bytes(lease.numpy()) == data[p * page : (p + 1) * page]
        except vfabric.ChecksumError as e:
            assert re.search(rf"page {p} of region .+: storage tier: slot \d+: .*corrupt", str(e)), str(e)
            refused += 1
    assert refused > 0


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_compressed_region_takes_less_of_the_tier_and_round_trips(tiered, codec):
    fabric, tier = tiered
    page = 64 << 10
    pages = 96  # 6 MiB: the GPU and host memory hold 2 MiB
    data = bytearray(pages * page)
    for p in range(pages):  # zeros but for each page's number: every page packs into one 4 KiB block
        data[p * page : p * page + 4] = p.to_bytes(4, "little")
    region = fabric.alloc(len(data), device="gpu0", compression=codec)
    fabric.write(region, 0, bytes(data))
    storage = fabric.stats()["storage"]
    assert storage["pages"] >= 64, storage
    assert storage["file_bytes"] * 8 <= storage["page_bytes"], storage
    assert fabric.read(region, 0, len(data)) == data
    with fabric.acquire(region, 70 * page, 2 * page, device="gpu0") as lease:
        assert bytes(lease.numpy()) == data[70 * page : 72 * page]
    # Packed pages changed on the disk are errors too, never data.
    with open(tier, "r+b") as f:
        for slot in range(128):
            f.seek(4096 + slot * page + 2)
            f.write(b"\xff\xff\xff\xff")
    with pytest.raises(vfabric.ChecksumError, match="corrupt"):
        fabric.read(region, 0, len(data))
    with pytest.raises(ValueError, match="unknown compression"):
        fabric.alloc(page, compression="zip")


def test_a_lossy_region_comes_back_within_its_bound(tiered):
    fabric, _ = tiered
    values = (np.random.default_rng(5).standard_normal(6 << 18) * 1e-3).astype(np.float32)  # 6 MiB
    region = fabric.alloc(values.nbytes, device="gpu0", compression="int8-f32")
    fabric.write(region, 0, values)
    storage = fabric.stats()["storage"]
    # A packed 64 KiB page (16 KiB of codes, 256 bytes of scales) takes five 4 KiB blocks of the file: 3.2x.
    assert storage["file_bytes"] * 3.2 <= storage["page_bytes"], storage
    back = np.frombuffer(fabric.read(region, 0, values.nbytes), dtype=np.float32).reshape(-1, 256)
    groups = values.reshape(-1, 256)
    # int8 codes with a scale per 256 values: half a step of the group's largest magnitude over 127.
    top = np.abs(groups).max(axis=1, keepdims=True)
    err = np.abs(back - groups)
    assert (err <= (top / 254 + 1e-6 * top) * (1 + 1e-5)).all()
    assert (err > 0).mean() > 0.5, "the pages that left the GPU went through the codec"
    with fabric.acquire(region, 0, 1 << 16, device="gpu0") as lease:
        got = np.frombuffer(bytes(lease.numpy()), dtype=np.float32)
        assert np.array_equal(got, back.reshape(-1)[: got.size])
    with pytest.raises(vfabric.DeviceUnavailable, match="lossily"):
        fabric.acquire(region, 0, 1 << 16, device="host")
    with pytest.raises(ValueError, match="fp8-bf16"):
        fabric.alloc(1 << 16, compression="fp4")
