#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with .device-bin/ carried (scripts/device-build.sh made it):
# the GPU tests, the demo, the PyTorch and NCCL baselines and vfabric-bench, in one call. Everything goes to
# $OUT/device-run.log; the benchmark's JSON and Markdown and the rebuilt PTX go beside it. A summary comes last.
# Back on the development machine, scripts/keep-results.sh OUTDIR puts them into bench/results/ (docs/benchmarks.md).
#
#   VFABRIC_BENCH_ARGS   extra arguments for vfabric-bench migrate (default: --sweep --sm-sweep)
#   VFABRIC_BENCH_NAME   name of the benchmark's result files (default: migrate-h200x2)
#   VFABRIC_PAGER_ARGS   extra arguments for vfabric-bench pager
#   VFABRIC_REMOTE_ARGS  extra arguments for vfabric-bench remote
#   VFABRIC_PAGER_NAME, VFABRIC_REMOTE_NAME   names of their result files (default: pager-h200x2, remote-h200x2)
#   VFABRIC_CONFIG       configuration of the demo, migrate, pager and status steps (default h200x2.toml)
#   VFABRIC_LOCAL_NAME   name of vfabric-bench local's result files (default: local-h200x2)
#   VFABRIC_LOCAL_CONFIG configuration of vfabric-bench local (default: h200x2.toml, whose GPU budget holds 1 GiB)
#   VFABRIC_STEPS        steps to run (default: all): machine pin ptx tests agents procs python info demo torch nccl migrate
#                        pager status sweep local trace storage lossy tiers train remote routes
#   VFABRIC_ROUTES_CONFIG, VFABRIC_ROUTES_HOME, VFABRIC_ROUTES_NAME, VFABRIC_ROUTES_ARGS   the routes step's
#                        cluster (default h200x2-agents.toml), the home's GPU (default gpu1; gpu0 with
#                        h200x1-agents.toml), result name (default lease-routes-h200x2) and extra arguments
#   VFABRIC_LOSSY_NAME, VFABRIC_LOSSY_ARGS   name of vfabric-bench lossy's result files (default: lossy-h200x1),
#                        and extra arguments (e.g. --size 64MiB --iters 1 for a short codec part)
#   VFABRIC_STORAGE_SIZE, VFABRIC_STORAGE_NAME, VFABRIC_STORAGE_ARGS   the storage step's file size (default
#                        16GiB), result name (default storage-h200x1) and extra arguments (e.g. --callers 4)
#   VFABRIC_TENSORS      0: the storage and lossy steps skip the trained tensors (no training run)
#   VFABRIC_PIN_GIB      size of the pin step's host memory files (default 8)
#   VFABRIC_PYTEST      what the python step's pytest runs (default: python/tests)
#   VFABRIC_SWEEP_PAIRS, VFABRIC_SWEEP_ARGS, VFABRIC_SWEEP_NAME   the sweep step's pairs, extra arguments (e.g.
#                        --mtu 16383 --lanes 4) and result name (default: all four pairs, none, sweep-h200x1)
#   VFABRIC_INFO_CONFIG  configuration of the info and sweep steps, given this machine's GPUs (default: h200x2.toml,
#                        whose host tier is 24 GiB)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vfabric-out}
mkdir -p "$OUT"
B=.device-bin
# The iperf3 that device-build.sh carried (the GPU machine has none), for the remote step's TCP baseline.
[ -x "$B/iperf3/iperf3" ] && ! command -v iperf3 > /dev/null && export PATH="$PWD/$B/iperf3:$PATH"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
LOG="$OUT/device-run.log"
: > "$LOG"
STEPS=${VFABRIC_STEPS:-machine pin ptx tests agents procs python info demo torch nccl migrate pager status sweep local trace storage lossy tiers train remote routes}
CONFIG=${VFABRIC_CONFIG:-cluster-configs/h200x2.toml}   # the demo, migrate, pager and status steps
summary=()

step() {
    local name=$1
    shift
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    echo "===== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    # Into the log as it comes: a step the call's time limit cuts off still leaves what it printed.
    "$@" 2>&1 | tee "$W/$name.log" >> "$LOG"
    local rc=${PIPESTATUS[0]}
    summary+=("$(printf '%-8s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
    echo "===== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
}

machine() {
    nvidia-smi -L
    nvidia-smi topo -m
    nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.mem,power.draw --format=csv
    nvcc --version | tail -2
    nproc
    command -v iperf3 > /dev/null && iperf3 --version | head -1
    # What pinning the host tier costs depends on these (shmem pages are 4 KiB unless shmem THP is on).
    for f in enabled shmem_enabled defrag; do
        echo "transparent_hugepage/$f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>/dev/null)"
    done
    grep -E "HugePages_Total|Hugepagesize|MemTotal" /proc/meminfo
    uname -r
    # What the QUIC sockets can get (network.socket_buffer is capped at these).
    echo "net.core.rmem_max $(cat /proc/sys/net/core/rmem_max) wmem_max $(cat /proc/sys/net/core/wmem_max)"
}

ptx() {
    local rc=0 k
    for k in page_copy page_codec page_sum; do
        nvcc -ptx -arch=compute_90 "transport/kernels/$k.cu" -o "$OUT/$k.ptx" || return 1
        nvcc -cubin -arch=sm_90 -Xptxas -v "transport/kernels/$k.cu" -o "$W/$k.cubin" 2>&1 | grep -E "Compiling|Used|spill"
        if cmp -s "$OUT/$k.ptx" "transport/kernels/$k.ptx"; then
            echo "PTX matches the committed transport/kernels/$k.ptx"
        else
            echo "PTX DIFFERS from the committed one: commit \$OUT/$k.ptx"
            rc=1
        fi
    done
    return $rc
}

step machine machine
# What pinning the host tier costs, and what makes it cheaper (bench/scripts/pin_probe.py).
step pin python3 bench/scripts/pin_probe.py --gib "${VFABRIC_PIN_GIB:-8}"
step ptx ptx
step tests "$B/gpu-tests" --test-threads=1
# Agents in one process on the GPU: a region's compression on every node, a lossy region leased from another.
step agents env VFABRIC_TEST_BACKEND=cuda "$B/compressed-tests" --test-threads=1
# Local clients in processes of their own on the GPU (the test binary runs itself again as the clients).
step procs "$B/local-tests" --test-threads=1
# The Python package from its wheel, with its tests (CUDA tensors through DLPack among them).
wheel() {
    [ -d "$W/py/vfabric" ] || python3 -m pip install --quiet --no-deps --no-index --target "$W/py" "$B"/wheels/*.whl
}
python_tests() {
    wheel || return 1
    # shellcheck disable=SC2086
    PYTHONPATH="$W/py" python3 -m pytest -q -rs ${VFABRIC_PYTEST:-python/tests}
}
step python python_tests
# h200x2.toml (8 GiB GPU budget, 24 GiB host tier) with its node given the GPUs this machine has: $W/machine.toml.
machine_config() {
    local gpus
    gpus=$(nvidia-smi -L | awk '{printf "%s%d", (NR > 1 ? ", " : ""), NR - 1}')
    sed "s/^gpus = .*/gpus = [$gpus]/" "${VFABRIC_INFO_CONFIG:-cluster-configs/h200x2.toml}" > "$W/machine.toml"
}
# `vfabric info` on that configuration: it reads the machine, it pins nothing (timed).
info_timed() {
    local t0 rc
    machine_config
    t0=$(date +%s%N)
    "$B/vfabric" info --config "$W/machine.toml"
    rc=$?
    echo "vfabric info took $((($(date +%s%N) - t0) / 1000000)) ms"
    return $rc
}
step info info_timed
step demo "$B/vfabric" demo --config "$CONFIG"
step torch env OUT="$W" python3 "$B/torch_ceilings.py"
[ -f "$W/probe.json" ] && cp "$W/probe.json" "$OUT/torch-probe.json"
step nccl python3 "$B/nccl_baseline.py"
# shellcheck disable=SC2086
step migrate "$B/vfabric-bench" migrate --config "$CONFIG" ${VFABRIC_BENCH_ARGS:---sweep --sm-sweep} \
    --out "$OUT" --name "${VFABRIC_BENCH_NAME:-migrate-h200x2}" --torch-json "$W/probe.json" --nccl-log "$W/nccl.log"
# shellcheck disable=SC2086
step pager "$B/vfabric-bench" pager --config "$CONFIG" ${VFABRIC_PAGER_ARGS:-} --out "$OUT" --name "${VFABRIC_PAGER_NAME:-pager-h200x2}"
# A node's agent and local clients in processes of their own.
# An agent serving 1,000 regions asked for its status and scraped, beside a ping (vfabric-bench status).
step status "$B/vfabric-bench" status --config "$CONFIG" --out "$OUT" --name status-h200x1
# Block size x batch x in flight x read/write between GPU 0 and host memory, and to a peer's (vfabric-bench sweep).
sweep() {
    machine_config
    # shellcheck disable=SC2086
    "$B/vfabric-bench" sweep --config "$W/machine.toml" \
        --pairs "${VFABRIC_SWEEP_PAIRS:-gpu0/host,host/gpu0,host/peer:host,host/peer:gpu0}" ${VFABRIC_SWEEP_ARGS:-} \
        --out "$OUT" --name "${VFABRIC_SWEEP_NAME:-sweep-h200x1}"
}
step sweep sweep
step local "$B/vfabric-bench" local --config "${VFABRIC_LOCAL_CONFIG:-cluster-configs/h200x2.toml}" --out "$OUT" --name "${VFABRIC_LOCAL_NAME:-local-h200x2}"
# PyTorch's allocator traces of a few training steps (its default allocator, and expandable segments), each
# replayed through the fabric's tensor pool.
traces() {
    local conf rc=0
    for conf in default expandable; do
        local env_conf=""
        [ "$conf" = expandable ] && env_conf="expandable_segments:True"
        PYTORCH_CUDA_ALLOC_CONF=$env_conf python3 "$B/capture_trace.py" --out "$OUT/trace-gpt-$conf.json" || return 1
        "$B/vfabric-bench" trace "$OUT/trace-gpt-$conf.json" --config cluster-configs/local.toml --out "$OUT" \
            --name "trace-h200x1-$conf" || rc=1
    done
    return $rc
}
step trace traces
# The storage tier's file I/O beside fio on the machine's disk, and LZ4 on pages of training data (synthetic,
# and a block of the small model after a few steps).
# A few steps of the small model (resident) leave a block's real tensors to compress, once a call.
trained_tensors() {
    [ "${VFABRIC_TENSORS:-1}" = 0 ] && return 0
    [ -d "$W/tensors" ] || python3 bench/scripts/train_offload.py --mode resident --layers 20 --d 2048 --heads 16 \
        --vocab 32768 --seq 2048 --batch 8 --steps 6 --warmup 2 --tag tensors --dump-tensors "$W/tensors" \
        > "$W/tensors.log" 2>&1 || echo "no tensors from training (see tensors.log)" >&2
    [ -d "$W/tensors" ] && echo "--tensors $W/tensors"
}
storage() {
    local tensors extra
    read -ra tensors <<< "$(trained_tensors)"
    read -ra extra <<< "${VFABRIC_STORAGE_ARGS:-}"
    "$B/vfabric-bench" storage --dir "$W/storage" --size "${VFABRIC_STORAGE_SIZE:-16GiB}" --depth 8,32,128 \
        --fio "$B/fio" "${tensors[@]}" --out "$OUT" --name "${VFABRIC_STORAGE_NAME:-storage-h200x1}" "${extra[@]}"
}
step storage storage
# The lossy codecs on the GPU (packed into host memory, expanded back) beside plain copies, on synthetic and
# trained tensors; then a lossy region walked over the packed tier beside host memory's frames (storage in $W).
lossy() {
    local tensors
    read -ra tensors <<< "$(trained_tensors)"
    # shellcheck disable=SC2086
    "$B/vfabric-bench" lossy --config "$CONFIG" "${tensors[@]}" --tier-dir "$W/lossy-tier" ${VFABRIC_LOSSY_ARGS:-} \
        --out "$OUT" --name "${VFABRIC_LOSSY_NAME:-lossy-h200x1}"
}
step lossy lossy
# Walks over three tiers: a region 8x the GPU budget with host memory of 2x, the rest on the storage tier in
# $W/tiers, beside the tier's raw reads.
# shellcheck disable=SC2086
step tiers "$B/vfabric-bench" pager --config "$CONFIG" --storage-dir "$W/tiers" --latency-samples 1000 \
    --compact-arena 0 ${VFABRIC_TIERS_ARGS:-} --out "$OUT" --name "${VFABRIC_TIERS_NAME:-pager-tiers-h200x1}"
# The training benchmark (bench/scripts/train_bench.sh; VFABRIC_TRAIN_RUNS picks runs, VFABRIC_TRAIN_BUDGET_S
# bounds them).
train() {
    wheel || return 1
    PYTHONPATH="$W/py" OUT="$OUT" RUNS="${VFABRIC_TRAIN_RUNS:-}" BUDGET_S="${VFABRIC_TRAIN_BUDGET_S:-540}" \
        bash bench/scripts/train_bench.sh
}
step train train
# Two agents, one per GPU, QUIC on loopback: GPU -> host -> QUIC -> host -> GPU.
# shellcheck disable=SC2086
# On a one-GPU machine: VFABRIC_REMOTE_CONFIG=cluster-configs/h200x1-agents.toml VFABRIC_REMOTE_HOME=gpu0.
step remote env VFABRIC_BIN="$B" bash scripts/remote-bench-procs.sh config \
    "${VFABRIC_REMOTE_CONFIG:-cluster-configs/h200x2-agents.toml}" g0 g1 --home-device "${VFABRIC_REMOTE_HOME:-gpu1}" \
    ${VFABRIC_REMOTE_ARGS:-} --out "$OUT" --name "${VFABRIC_REMOTE_NAME:-remote-h200x2}"
# Two agents leasing each other's pages onto their GPU by QUIC and over an NCCL channel, beside NCCL's own
# send/recv. Each agent names its host apart for NCCL (NCCL_HOSTID), so two agents sharing one GPU (the one-GPU
# machine: VFABRIC_ROUTES_CONFIG=cluster-configs/h200x1-agents.toml) join a channel through NCCL's network
# transport on loopback.
# shellcheck disable=SC2086
step routes env NCCL_HOSTID=vfabric-g0 NCCL_SOCKET_IFNAME=lo VFABRIC_BENCH=lease-routes VFABRIC_BIN="$B" \
    VFABRIC_PEER_LOG="$OUT/${VFABRIC_ROUTES_NAME:-lease-routes-h200x2}-peer.log" bash scripts/remote-bench-procs.sh config \
    "${VFABRIC_ROUTES_CONFIG:-cluster-configs/h200x2-agents.toml}" g0 g1 --home-device "${VFABRIC_ROUTES_HOME:-gpu1}" \
    ${VFABRIC_ROUTES_ARGS:-} \
    --out "$OUT" --name "${VFABRIC_ROUTES_NAME:-lease-routes-h200x2}"

echo
echo "===== summary" | tee -a "$LOG"
grep -E "^test result|^test .*FAILED" "$W/tests.log" "$W/agents.log" "$W/procs.log" 2>/dev/null | tee -a "$LOG"
tail -n 3 "$W/python.log" 2>/dev/null | tee -a "$LOG"
grep -E "verified|DATA" "$W/demo.log" 2>/dev/null | tee -a "$LOG"
for s in "${summary[@]}"; do echo "$s" | tee -a "$LOG"; done
