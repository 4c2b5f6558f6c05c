#!/usr/bin/env bash
# Builds the Python package's release wheel (abi3: one wheel for CPython 3.9 and later) into .device-bin/wheels/,
# for the GPU machine, which has no Rust toolchain: there, `pip install .device-bin/wheels/vfabric-*.whl`.
# Only the python crate (and what it depends on) is built in the release profile. Run it after
# scripts/device-build.sh, which empties .device-bin/.
#
#   bash scripts/python-wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
out=.device-bin/wheels

bash scripts/python-venv.sh
rm -rf "$out"
"$venv/bin/maturin" build --locked --release -m python/Cargo.toml --interpreter "$venv/bin/python" --out "$out"
ls -l "$out"
