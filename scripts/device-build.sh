#!/usr/bin/env bash
# Builds, here, everything the GPU machine runs, into .device-bin/ (ignored by git, carried by the device call):
# the vfabric and vfabric-bench binaries, the GPU test executable, and the baseline scripts.
# The GPU machine has no Rust toolchain; cudarc loads the driver at run time, so nothing CUDA is needed here.
#
#   bash scripts/device-build.sh
#   then, with the device tool: run  command="bash scripts/device-run.sh"  carry=[".device-bin"]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.device-bin
rm -rf "$bin"
mkdir -p "$bin"
cargo build --release --locked -p vfabric -p vfabric-bench
gpu_test=$(cargo test --release --locked -p vfabric-tests --features gpu --test gpu --no-run --message-format=json |
    python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')
if [ -z "$gpu_test" ]; then
    echo "could not find the gpu test executable" >&2
    exit 1
fi
cp target/release/vfabric target/release/vfabric-bench "$bin/"
cp "$gpu_test" "$bin/gpu-tests"
strip "$bin/gpu-tests" 2>/dev/null || true
cp bench/scripts/*.py "$bin/"
du -sh "$bin"/*
