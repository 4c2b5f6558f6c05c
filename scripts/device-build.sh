#!/usr/bin/env bash
# Builds, here, everything the GPU machine runs, into .device-bin/ (ignored by git, carried by the device call):
# the vfabric and vfabric-bench binaries, the GPU, local-process and compressed-regions test executables, the
# Python wheel, and the baseline scripts.
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
# A test target's executable (its name has a hash in it): cargo says where it is. PACKAGE defaults to
# vfabric-tests (built with its gpu feature).
test_exe() { # TEST [PACKAGE]
    local pkg=(-p vfabric-tests --features gpu)
    [ -n "${2:-}" ] && pkg=(-p "$2")
    cargo test --release --locked "${pkg[@]}" --test "$1" --no-run --message-format=json |
        python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
cp target/release/vfabric target/release/vfabric-bench "$bin/"
# The device suite on the GPU, local clients in processes of their own (which open the GPU there), and agents
# in one process keeping a region's compression (vfabric's own test, run there with VFABRIC_TEST_BACKEND=cuda).
for t in gpu:gpu-tests local_processes:local-tests vfabric/compressed_regions:compressed-tests; do
    test=${t%%:*}
    pkg=
    case $test in */*) pkg=${test%%/*}; test=${test#*/} ;; esac
    exe=$(test_exe "$test" "$pkg")
    if [ -z "$exe" ]; then
        echo "could not find the $test test executable" >&2
        exit 1
    fi
    cp "$exe" "$bin/${t##*:}"
    strip "$bin/${t##*:}" 2>/dev/null || true
done
# The Python package as an abi3 wheel, with pytest's wheels (the GPU machine has no internet).
[ -f scripts/python-wheel.sh ] && bash scripts/python-wheel.sh
cp bench/scripts/*.py "$bin/"
# iperf3, the TCP baseline of `vfabric-bench remote`, with the libraries it links (the GPU machine has no
# iperf3 and no internet). `iperf3/iperf3` is a wrapper that points the loader at them; device-run.sh puts it
# on PATH. Skipped, with a note, where this machine has no iperf3.
if command -v iperf3 > /dev/null; then
    mkdir -p "$bin/iperf3/lib"
    cp "$(command -v iperf3)" "$bin/iperf3/iperf3.bin"
    for lib in libiperf.so.0 libsctp.so.1 libcrypto.so.3; do
        path=$(ldd "$(command -v iperf3)" | awk -v l="$lib" '$1 == l { print $3 }')
        [ -n "$path" ] && cp -L "$path" "$bin/iperf3/lib/$lib"
    done
    cat > "$bin/iperf3/iperf3" <<'SH'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/iperf3.bin" "$@"
SH
    chmod +x "$bin/iperf3/iperf3"
else
    echo "no iperf3 here (apt install iperf3): the GPU run's remote step will have no TCP baseline" >&2
fi
# fio, the baseline of `vfabric-bench storage`, built small (scripts/fio-build.sh).
bash scripts/fio-build.sh "$bin/fio" || echo "could not build fio: the GPU run's storage step will fail" >&2
du -sh "$bin"/*
