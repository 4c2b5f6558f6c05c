"""Regions: allocation, bytes in and out through every kind of buffer, handles that cross processes."""

import pickle

import numpy as np
import pytest

import vfabric


def test_fabric_describes_its_devices(fabric):
    assert fabric.device_kind == "emulated"
    assert fabric.devices == ["gpu0", "gpu1", "host"]
    assert fabric.page_size == 2 << 20
    assert "emulated" in repr(fabric)
    assert isinstance(fabric, vfabric.FabricBase)


def test_write_read_round_trip(fabric):
    r = fabric.alloc(5 << 20, device="gpu0")
    assert r.nbytes == 6 << 20  # whole pages
    assert r.page_size == 2 << 20
    data = np.random.default_rng(1).integers(0, 256, size=3 << 20, dtype=np.uint8)
    fabric.write(r, 12345, data)  # a NumPy array, across a page boundary
    assert fabric.read(r, 12345, data.nbytes) == data.tobytes()
    assert fabric.read(r, 0, 4) == b"\0\0\0\0"  # never written: zeros
    fabric.write(r, 7, b"bytes")
    fabric.write(r, 20, bytearray(b"bytearray"))
    fabric.write(r, 40, memoryview(b"..memoryview..")[2:-2])
    assert fabric.read(r, 7, 5) == b"bytes"
    assert fabric.read(r, 20, 9) == b"bytearray"
    assert fabric.read(r, 40, 10) == b"memoryview"
    floats = np.linspace(0, 1, 1000, dtype=np.float32)
    fabric.write(r, 1 << 20, floats)
    back = np.frombuffer(fabric.read(r, 1 << 20, floats.nbytes), dtype=np.float32)
    np.testing.assert_array_equal(back, floats)
    fabric.free(r)


def test_read_into_fills_a_buffer(fabric):
    r = fabric.alloc(1 << 20)
    fabric.write(r, 100, np.arange(256, dtype=np.uint8))
    out = np.zeros(256, dtype=np.uint8)
    fabric.read_into(r, 100, out)
    np.testing.assert_array_equal(out, np.arange(256, dtype=np.uint8))
    buf = bytearray(4)
    fabric.read_into(r, 101, buf)
    assert buf == bytearray([1, 2, 3, 4])
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        fabric.read_into(r, 0, np.zeros((4, 4), dtype=np.uint8)[:, 1])
    with pytest.raises((TypeError, BufferError)):
        fabric.read_into(r, 0, b"read-only bytes")


def test_alloc_options(fabric):
    for device in ["gpu0", "gpu1", "host", None]:
        r = fabric.alloc(1 << 20, device=device, priority="high", tenant=3)
        fabric.write(r, 0, b"x")
        assert fabric.read(r, 0, 1) == b"x"
        fabric.free(r)


def test_migrate_and_prefetch_move_pages(fabric):
    r = fabric.alloc(4 << 20, device="gpu0")
    fabric.write(r, 0, b"\x07" * (4 << 20))
    fabric.migrate(r, "gpu1")
    before = fabric.stats()["traffic"]["fetched"]
    fabric.prefetch(r, 0, 4 << 20, "gpu0")  # starts the copies and returns
    assert fabric.stats()["directory"]["leases"] == 0  # the prefetch holds nothing
    with fabric.acquire(r, 0, 4 << 20, device="gpu0") as lease:  # finds the pages there (or waits for them)
        assert lease.contiguous
    traffic = fabric.stats()["traffic"]
    assert traffic["fetched"] == before + (4 << 20), "fetched once, by the prefetch"
    assert traffic["prefetched"] == 4 << 20
    assert fabric.read(r, (4 << 20) - 1, 1) == b"\x07"


def test_stats_are_a_dict(fabric):
    r = fabric.alloc(2 << 20)
    fabric.write(r, 0, b"abc")
    s = fabric.stats()
    assert s["directory"]["regions"] == 1
    assert s["traffic"]["host_io"] == 3
    assert [d["location"] for d in s["directory"]["devices"]] == [{"Gpu": 0}, {"Gpu": 1}, "Host"]


def test_region_tuple_and_pickle_round_trip(fabric):
    r = fabric.alloc(3 << 20)
    t = r.to_tuple()
    assert len(t) == 5 and all(isinstance(x, int) for x in t)
    back = vfabric.Region.from_tuple(t)
    assert back == r and hash(back) == hash(r)
    assert vfabric.Region(*t) == r
    assert pickle.loads(pickle.dumps(r)) == r
    assert {r: 1}[back] == 1
    other = fabric.alloc(3 << 20)
    assert other != r
    assert "nbytes=4194304" in repr(r)
    fabric.write(back, 0, b"via the copy")
    assert fabric.read(r, 0, 12) == b"via the copy"


def test_region_tuples_are_checked():
    with pytest.raises(ValueError):
        vfabric.Region.from_tuple((0, 100, 3 << 20, 0, 1))  # page size not a power of two
    with pytest.raises(ValueError):
        vfabric.Region.from_tuple((0, 100, 1 << 16, 0, 1))  # not whole pages
    with pytest.raises(ValueError):
        vfabric.Region.from_tuple((0, 1 << 16, 1 << 16, 0))
    with pytest.raises(ValueError):
        vfabric.Region.from_tuple((-1, 1 << 16, 1 << 16, 0, 1))


def test_a_forged_region_is_refused(fabric):
    r = fabric.alloc(2 << 20)
    addr, nbytes, page, slot, generation = r.to_tuple()
    stale = vfabric.Region(addr, nbytes, page, slot, generation + 1)
    with pytest.raises(vfabric.FabricError):
        fabric.read(stale, 0, 1)
    elsewhere = vfabric.Region(addr + (64 << 20), nbytes, page, slot + 7, generation)
    with pytest.raises(vfabric.FabricError):
        fabric.write(elsewhere, 0, b"x")
