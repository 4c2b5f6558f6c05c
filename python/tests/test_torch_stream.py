"""vfabric.torch.stream() on CUDA (the GPU machine): the training benchmark's GPT-style decoder, small, trained
with its blocks streamed through the fabric against the same model resident on the GPU, step by step, with and
without gradient accumulation, micro-batch by micro-batch and block by block. Skipped where torch or a GPU is
missing (CI runs the schedule itself on NumPy: test_streaming.py, and block by block on CPU tensors where torch
is installed: test_torch_blocks.py)."""

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "scripts" / "train_offload.py"
TINY = ["--layers", "4", "--d", "256", "--heads", "4", "--vocab", "1024", "--seq", "128", "--batch", "4", "--steps", "8",
        "--warmup", "2", "--fabric-budget", "72MiB", "--lookahead", "1"]


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def train(mode: str, *extra: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--mode", mode, *TINY, *extra], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.skipif(not cuda_available(), reason="needs torch and a GPU")
@pytest.mark.parametrize("accum,schedule", [("1", []), ("3", []), ("3", ["--schedule", "blocks", "--group", "2"])])
def test_streamed_blocks_train_as_the_resident_model_does(accum, schedule):
    resident = train("resident", "--accum", accum)
    streamed = train("vfabric", "--accum", accum, *schedule)
    assert streamed["losses"] == pytest.approx(resident["losses"], rel=5e-3), (resident["losses"], streamed["losses"])
    assert streamed["losses"][-1] < streamed["losses"][0] - 0.5, "the model learns"
    traffic = streamed["fabric_traffic_GB"]
    # Four blocks of 0.8 M parameters (14 bytes each in the fabric) do not fit a 64 MiB budget beside each other's
    # prefetches: every step moves them, by prefetch and write-back.
    assert traffic["prefetched"] > 0 and traffic["written_back"] > 0, traffic
