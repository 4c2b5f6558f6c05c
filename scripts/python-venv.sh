#!/usr/bin/env bash
# The Python environment the package is built and tested in: a venv under target/pyenv with maturin (1.x),
# pytest, numpy and matplotlib (the benchmark plots), and PyTorch and Hugging Face transformers, pinned to the
# GPU machine's versions (PyPI's torch wheel runs on a machine without a GPU: the torch tests there run on the
# emulated device's CPU tensors; accelerate for transformers.Trainer). Creates it when missing (installing python3-venv with apt
# when `python3 -m venv` cannot, as root or through sudo), then makes sure the tools are there. Used by
# python-tests.sh and python-wheel.sh.
#
#   bash scripts/python-venv.sh        # prints nothing on success but pip's complaints; exits non-zero on failure
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv

fail() {
    echo "python-venv: FAILED: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || fail "no python3 on PATH (install python3 3.9 or later)"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sys" >/dev/null 2>&1; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a package of its own.
        rm -rf "$venv"
        echo "python-venv: python3 -m venv failed: installing python3-venv with apt"
        sudo=()
        if [ "$(id -u)" != 0 ]; then
            command -v sudo >/dev/null 2>&1 || fail "python3 -m venv needs python3-venv: run 'apt-get install python3-venv' as root"
            sudo=(sudo -E)
        fi
        export DEBIAN_FRONTEND=noninteractive
        "${sudo[@]}" apt-get update -qq || fail "apt-get update"
        "${sudo[@]}" apt-get install -y -qq python3-venv >/dev/null || fail "apt-get install python3-venv"
        python3 -m venv "$venv" || fail "python3 -m venv $venv, even with python3-venv installed"
    fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2" pytest numpy matplotlib \
    "torch==2.11.0" "transformers==5.17.0" "accelerate==1.15.0" ||
    fail "pip install maturin pytest numpy matplotlib torch transformers accelerate into $venv"
