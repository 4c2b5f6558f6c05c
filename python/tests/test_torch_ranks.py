"""Data parallelism on CUDA (the GPU machine): the training benchmark's decoder, small, trained by two ranks started
as torchrun starts them, each on its own batch: DDP with the model resident, FSDP2 with CPU offload, and the
blocks streamed through the fabric of the node's agent (local rank 0 starts it) with each block's gradients
averaged across the ranks before its step. Every run must end with the same weights on both ranks, and the
streamed run must take DDP's steps (its losses, to bf16 rounding). On a one-GPU machine both ranks share the GPU
(each its own NCCL_HOSTID: bench/scripts/train_ranks.py). Skipped where torch or a GPU is missing (CI runs the
reduction's schedule on NumPy: test_streaming.py)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "scripts" / "train_offload.py"
TINY = ["--layers", "4", "--d", "256", "--heads", "4", "--vocab", "1024", "--seq", "128", "--batch", "4", "--steps", "6",
        "--warmup", "2", "--fabric-budget", "72MiB", "--lookahead", "1"]
RANKS = 2


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(tmp_path: pathlib.Path, mode: str, *extra: str) -> dict:
    """Runs RANKS ranks of train_offload.py; returns rank 0's result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "NCCL_HOSTID"))}
    env.update(VFABRIC_SOCKET=str(tmp_path / f"{mode}.sock"), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(RANKS), LOCAL_WORLD_SIZE=str(RANKS), NCCL_NVLS_ENABLE="0")
    procs, logs = [], [tmp_path / f"{mode}-{r}.log" for r in range(RANKS)]
    try:
        for r in range(RANKS):
            # Into files: a rank whose pipe nobody reads would stop in a write, and its peer in a collective.
            with open(logs[r], "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(SCRIPT), "--mode", mode, *TINY, *extra, "--tag", f"{mode}-r{r}"],
                    env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:  # only the processes this test started
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = [log.read_text() for log in logs]
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"{mode}: rank {r} failed:\n{out}"
    line = next(l for l in outputs[0].splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.skipif(not cuda_available(), reason="needs torch and a GPU")
@pytest.mark.parametrize("accum", ["1", "2"])
def test_ranks_streaming_through_the_nodes_agent_take_ddps_steps(tmp_path, accum):
    ddp = train(tmp_path, "resident", "--accum", accum)
    streamed = train(tmp_path, "vfabric", "--accum", accum, "--host-layers", "1")
    for run in (ddp, streamed):
        assert run["world"] == RANKS and run["replicas_equal"] is True, run
        assert run["losses"][-1] < run["losses"][0] - 0.5, "the model learns"
    assert streamed["losses"] == pytest.approx(ddp["losses"], rel=5e-3), (ddp["losses"], streamed["losses"])
    assert "agent" in streamed["info"]["data_parallel"], streamed["info"]
    assert not (tmp_path / "vfabric.sock").exists(), "the agent went with local rank 0"


@pytest.mark.skipif(not cuda_available(), reason="needs torch and a GPU")
def test_fsdp2_with_cpu_offload_over_two_ranks_learns_as_ddp_does(tmp_path):
    ddp = train(tmp_path, "resident")
    fsdp = train(tmp_path, "fsdp")
    assert fsdp["world"] == RANKS
    # Parameters in bf16 for compute, gradients reduced in fp32: close to DDP's, not equal.
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=2e-2), (ddp["losses"], fsdp["losses"])
