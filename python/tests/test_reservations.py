"""Reservations from Python: memory of a device set aside before a task runs, taken by the regions that name
it and by nobody else, refused at once when it cannot be had, and given back by release() or a with block; the
same through a node's agent, where a client's reservations are its own and end with its connection."""

import json
import subprocess
import sys
import textwrap

import pytest

import vfabric

PAGE = 64 << 10


def test_a_reservation_holds_memory_for_the_regions_that_name_it(small):
    # 16 frames on gpu0. A region fills 12 of them; reserving 8 evicts 4 of its pages (to host memory).
    a = small.alloc(12 * PAGE, device="gpu0")
    data = bytes(range(256)) * (12 * PAGE // 256)
    small.write(a, 0, data)
    r = small.reserve(8 * PAGE, device="gpu0")
    assert (r.device, r.nbytes, r.released) == ("gpu0", 8 * PAGE, False)
    assert "gpu0" in repr(r)
    # Others cannot take it: 8 frames are left to everybody else.
    b = small.alloc(10 * PAGE, device="gpu0")
    with pytest.raises(vfabric.OutOfMemory):
        small.acquire(b, 0, 10 * PAGE, device="gpu0")
    # A region naming it takes its frames as its pages arrive on gpu0.
    c = small.alloc(6 * PAGE, device="gpu0", reservation=r)
    with small.acquire(c, 0, 6 * PAGE, device="gpu0", mode="write") as lease:
        lease.numpy()[:] = 7
    assert r.nbytes == 2 * PAGE
    assert small.read(a, 0, len(data)) == data, "the evicted pages came back whole"
    # More than can be had: refused at once, saying what can.
    with pytest.raises(vfabric.OutOfMemory, match="cannot reserve"):
        small.reserve(64 * PAGE, device="gpu0")
    with r:
        pass  # leaving the block gives back what it still holds
    assert r.released and r.nbytes == 0
    r.release()  # twice: nothing
    with pytest.raises(ValueError, match="released"):
        small.alloc(PAGE, reservation=r)


def test_a_reservation_belongs_to_its_fabric(small, tmp_path):
    other = vfabric.Fabric()
    r = other.reserve(PAGE, device="host")
    with pytest.raises(ValueError, match="another fabric"):
        small.alloc(PAGE, reservation=r)
    with pytest.raises(ValueError, match="nbytes"):
        small.reserve(-1)
    with pytest.raises(vfabric.DeviceUnavailable):
        small.reserve(PAGE, device="gpu7")
    r.release()


def test_a_clients_reservations_are_held_at_the_agent(tmp_path):
    cfg = tmp_path / "emulated.toml"
    cfg.write_text(
        '[cluster]\nname = "t"\n[device]\nbackend = "emulated"\nemulated_gpus = 1\nemulated_gpu_memory = "64MiB"\n'
        '[memory]\npage_size = "64KiB"\ngpu_budget = "1MiB"\nheadroom_percent = 0\nreadahead = "0"\n'
        'high_watermark_percent = 100\nlow_watermark_percent = 100\n[[node]]\nname = "t"\n'
    )
    code = """
        import json, os, sys
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", VFABRIC_CONFIG=sys.argv[1])
        os.environ["VFABRIC_SOCKET"] = sys.argv[2]
        import vfabric
        page = 64 << 10
        client = vfabric.connect()  # local rank 0: starts the agent in this process
        r = client.reserve(10 * page, device="gpu0")
        held = r.nbytes
        other = client.alloc(8 * page, device="gpu0")
        try:
            client.acquire(other, 0, 8 * page, device="gpu0")
            refused = False
        except vfabric.OutOfMemory:
            refused = True
        mine = client.alloc(4 * page, device="gpu0", reservation=r)
        with client.acquire(mine, 0, 4 * page, device="gpu0", mode="write") as lease:
            lease.numpy()[:] = 3
        after = r.nbytes
        try:
            client.reserve(64 * page, device="gpu0")
            too_much = None
        except vfabric.OutOfMemory as e:
            too_much = str(e)
        r.release()
        with client.acquire(other, 0, 8 * page, device="gpu0"):
            pass
        print(json.dumps({"held": held, "refused": refused, "after": after, "too_much": too_much, "released": r.nbytes}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(cfg), str(tmp_path / "agent.sock")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["held"] == 10 * PAGE
    assert r["refused"], "the client's other region cannot take reserved memory"
    assert r["after"] == 6 * PAGE
    assert r["too_much"] and "cannot reserve" in r["too_much"], r
    assert r["released"] == 0
