#!/usr/bin/env bash
# Builds the Python package's release wheel (abi3: one wheel for CPython 3.9 and later) into .device-bin/wheels/,
# for the GPU machine, which has no Rust toolchain and no package index, with pytest's wheels (pure Python)
# beside it. Only the python crate (and what it depends on) is built in the release profile. Run it after
# scripts/device-build.sh, which empties .device-bin/.
#
#   bash scripts/python-wheel.sh
#
# On the GPU machine (its Python has PyTorch and NumPy), from the repository's root:
#   python3 -m venv --system-site-packages /tmp/vf
#   /tmp/vf/bin/pip install --no-index --find-links .device-bin/wheels vfabric pytest
#   /tmp/vf/bin/python -m pytest -q -p no:cacheprovider python/tests    # test_cuda.py runs there
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
out=.device-bin/wheels

bash scripts/python-venv.sh
rm -rf "$out"
"$venv/bin/maturin" build --locked --release -m python/Cargo.toml --interpreter "$venv/bin/python" --out "$out"
"$venv/bin/python" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$out" pytest
ls -l "$out"
