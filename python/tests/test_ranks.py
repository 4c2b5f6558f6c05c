"""Ranks of one host sharing a region through the agent their local rank 0 starts: four Python processes under
`mpirun -np 4`, and four started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE).
Each writes its slice through its own mapping; rank 0 checks them all (jobs/share_slices.py). The agent runs as
a process of its own (or in rank 0's, VFABRIC_HOST_AGENT=thread), and goes with rank 0, even when it is killed."""

import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

JOBS = pathlib.Path(__file__).parent / "jobs"
JOB = JOBS / "share_slices.py"
RANKS = 4


def clean_env(tmp_path: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "VFABRIC_CONFIG"):
        env.pop(k, None)
    # A socket of this test's own, so concurrent runs never share an agent.
    env["VFABRIC_SOCKET"] = str(tmp_path / "agent.sock")
    return env


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return re.search(r"^State:\s+Z", status, re.M) is not None


def check(outputs: list, socket: pathlib.Path) -> None:
    for r in range(RANKS):
        assert any(f"rank {r} of {RANKS} ok" in o for o in outputs), f"rank {r} did not finish:\n" + "\n".join(outputs)
    assert not socket.exists(), "the agent's socket goes with local rank 0"
    pids = [int(m) for o in outputs for m in re.findall(r"^agent (\d+)$", o, re.M)]
    assert len(pids) == 1 and gone(pids[0]), f"the agent ({pids}) ends with local rank 0"


@pytest.mark.parametrize("where", ["process", "thread"])
def test_torchrun_style_ranks_share_a_region(tmp_path, where):
    env = dict(clean_env(tmp_path), VFABRIC_HOST_AGENT=where)
    procs = []
    for r in range(RANKS):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(RANKS))
        procs.append(subprocess.Popen([sys.executable, str(JOB), str(tmp_path)], env=e, stdout=subprocess.PIPE, text=True))
    outputs = []
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, f"rank {r} failed:\n{out}"
        outputs.append(out)
    check(outputs, tmp_path / "agent.sock")


def test_mpirun_ranks_share_a_region(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("this test needs Open MPI's mpirun (apt-get install openmpi-bin)")
    env = clean_env(tmp_path)
    # One host: no remote shell is ever started, but Open MPI looks for one unless told which (machines
    # without ssh, such as containers, have none).
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "plm_rsh_agent", "false"]
    cmd += ["-np", str(RANKS), "-x", "VFABRIC_SOCKET", "-x", "PATH"]
    if "PYTHONPATH" in env:
        cmd += ["-x", "PYTHONPATH"]
    cmd += [sys.executable, str(JOB), str(tmp_path)]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, f"mpirun failed:\n{done.stdout}"
    check([done.stdout], tmp_path / "agent.sock")


def test_the_agent_process_ends_when_rank_0_is_killed(tmp_path):
    env = dict(clean_env(tmp_path), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    env.pop("VFABRIC_HOST_AGENT", None)  # the default: a process of its own
    rank = subprocess.Popen(
        [sys.executable, str(JOBS / "hold_agent.py")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([rank.stdout], [], [], 120)
        assert ready, "rank 0 said nothing in 120 s"
        line = rank.stdout.readline()
        match = re.fullmatch(r"agent (\d+)\n", line)
        assert match, f"rank 0 said {line!r}"
        pid = int(match.group(1))
        assert pid != rank.pid and not gone(pid)
    finally:
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    outlived = not gone(pid)
    if outlived:
        os.kill(pid, signal.SIGKILL)  # this test's own agent: not left behind
    assert not outlived, "the agent process outlived the rank that started it"
    assert not (tmp_path / "agent.sock").exists(), "it removed its socket on the way out"
