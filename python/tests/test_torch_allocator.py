"""The fabric as PyTorch's CUDA allocator (vfabric.torch). The allocator's C functions, through ctypes as PyTorch
calls them, run everywhere (on the emulated device in CI); the training loop on CUDA runs where torch and a GPU
are (the GPU machine). Each in a process of its own: the allocator is one per process."""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

import vfabric

JOBS = pathlib.Path(__file__).parent / "jobs"


def run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_allocators_c_functions_pack_blocks_and_give_them_back(tmp_path):
    cfg = tmp_path / "emulated.toml"
    cfg.write_text('[cluster]\nname = "t"\n[device]\nbackend = "emulated"\n[memory]\npage_size = "2MiB"\n[[node]]\nname = "t"\n')
    out = run(
        """
        import ctypes, json, sys
        import vfabric, vfabric.torch
        from vfabric import _native
        assert vfabric.torch.memory_stats() is None
        assert _native._torch_allocator_start(sys.argv[1], 128 << 20) == "emulated"
        lib = ctypes.CDLL(_native.__file__)
        lib.vfabric_torch_malloc.restype = ctypes.c_void_p
        lib.vfabric_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vfabric_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        small = [lib.vfabric_torch_malloc(4 + 100 * i, 0, None) for i in range(200)]
        large = [lib.vfabric_torch_malloc(16 << 20, 0, None) for _ in range(3)]
        assert all(small) and all(large) and len(set(small + large)) == 203
        assert all(p % 512 == 0 for p in small)
        during = vfabric.torch.memory_stats()["pools"]["gpu0"]
        too_big = lib.vfabric_torch_malloc(1 << 40, 0, None)
        assert lib.vfabric_torch_malloc(0, 0, None) is None, "an empty tensor's null pointer, not a failure"
        lib.vfabric_torch_free(None, 0, 0, None)
        for p in small + large:
            lib.vfabric_torch_free(p, 0, 0, None)
        after = vfabric.torch.memory_stats()
        try:
            _native._torch_allocator_start(sys.argv[1], None)
            twice = "started twice"
        except vfabric.ConfigError:
            twice = "refused"
        print(json.dumps({"during": during, "after": after, "too_big": too_big, "twice": twice}))
        """,
        str(cfg),
    )
    r = json.loads(out.strip().splitlines()[-1])
    during, after = r["during"], r["after"]
    assert during["slabs"] == 1 and during["large"] == 3, during
    assert during["allocated"] == sum(4 + 100 * i for i in range(200)) + 3 * (16 << 20)
    assert r["too_big"] is None, "an allocation beyond the GPU is a null pointer (PyTorch's out-of-memory)"
    assert after["failed_allocations"] == 1 and after["pending_frees"] == 0
    assert after["pools"]["gpu0"]["allocated"] == 0 and after["pools"]["gpu0"]["large"] == 0
    assert r["twice"] == "refused"


def test_the_allocator_over_a_client_takes_the_agents_memory(tmp_path, monkeypatch):
    cfg = tmp_path / "emulated.toml"
    cfg.write_text('[cluster]\nname = "t"\n[device]\nbackend = "emulated"\n[memory]\npage_size = "2MiB"\n[[node]]\nname = "t"\n')
    out = run(
        """
        import ctypes, json, os, sys
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", VFABRIC_CONFIG=sys.argv[1])
        os.environ["VFABRIC_SOCKET"] = sys.argv[2]
        import vfabric, vfabric.torch
        from vfabric import _native
        client = vfabric.connect()  # local rank 0: starts the agent in this process
        assert _native._torch_allocator_attach(client) == "emulated"
        lib = ctypes.CDLL(_native.__file__)
        lib.vfabric_torch_malloc.restype = ctypes.c_void_p
        lib.vfabric_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vfabric_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        blocks = [lib.vfabric_torch_malloc(1000 + i, 0, None) for i in range(20)] + [lib.vfabric_torch_malloc(12 << 20, 0, None)]
        assert all(blocks)
        at_agent = client.stats()["directory"]["regions"]
        for p in blocks:
            lib.vfabric_torch_free(p, 0, 0, None)
        print(json.dumps({"at_agent": at_agent, "stats": vfabric.torch.memory_stats()}))
        """,
        str(cfg),
        str(tmp_path / "agent.sock"),
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["at_agent"] == 2, "a slab and a large region, allocated at the agent"
    pool = r["stats"]["pools"]["gpu0"]
    assert (pool["slabs"], pool["allocated"], pool["allocations"]) == (1, 0, 21), pool


def test_sizes_are_read_or_refused():
    from vfabric.torch import _bytes

    assert (_bytes("20GiB"), _bytes("512 MiB"), _bytes(7), _bytes(None)) == (20 << 30, 512 << 20, 7, None)
    with pytest.raises(ValueError):
        _bytes("20 gallons")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def stats_ok(runs: dict) -> bool:
    pool = runs["vfabric"]["stats"]["pools"]["gpu0"]
    return 0.5 * runs["torch"]["max_allocated"] <= pool["peak_allocated"] <= 2 * runs["torch"]["max_allocated"]


@pytest.mark.skipif(not cuda_available(), reason="needs torch and a GPU")
def test_a_training_loop_on_the_fabric_matches_pytorchs_own_allocator():
    runs = {}
    for mode in ("torch", "vfabric", "vfabric-client"):
        out = run(open(JOBS / "train_tiny.py").read(), mode)
        runs[mode] = json.loads(out.strip().splitlines()[-1])
    assert runs["torch"]["losses"] == pytest.approx(runs["vfabric"]["losses"], rel=1e-3), runs
    assert runs["torch"]["losses"] == pytest.approx(runs["vfabric-client"]["losses"], rel=1e-3), runs
    assert runs["vfabric-client"]["stats"]["failed_allocations"] == 0
    assert runs["vfabric"]["losses"][-1] < runs["vfabric"]["losses"][0], "the model learns"
    # The pool held about what PyTorch's own allocator reported as allocated at its peak.
    assert stats_ok(runs)
    stats = runs["vfabric"]["stats"]["pools"]["gpu0"]
    assert stats["allocations"] > 100 and stats["peak_allocated"] > 0, stats
    assert runs["vfabric"]["stats"]["failed_allocations"] == 0
