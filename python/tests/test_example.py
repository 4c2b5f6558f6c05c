"""The quickstart example runs as a user would run it: in a process of its own."""

import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"


def test_quickstart_runs():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"quickstart failed:\n{done.stdout}\n{done.stderr}"
    assert "out of bounds, as expected" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("done:")
