#!/usr/bin/env bash
# vfabric-bench remote with the two agents in separate processes: `loopback` (127.0.0.1, like iperf3 and
# quinn's perf tool run) or `netns` (two network namespaces from scripts/netns.sh, the baseline iperf3 across
# the same veth path). The peer agent runs `vfabric agent`; this script ends it (by PID) and removes what it
# made, also on failure.
# Usage: scripts/remote-bench-procs.sh loopback|netns [vfabric-bench remote args...]   (netns: as root)
#        scripts/remote-bench-procs.sh config FILE THIS PEER [args...]   (the agents of FILE's nodes THIS and PEER,
#        certificates made afresh; e.g. cluster-configs/h200x2-agents.toml g0 g1 on the GPU machine)
# VFABRIC_LANES=N sets network.lanes (the QUIC connections for bulk transfers, beside the latency lane) for both,
# VFABRIC_NETWORK='k = v; ...'
# and VFABRIC_MEMORY other [network] and [memory] settings, VFABRIC_MTU the packet size; VFABRIC_AGENT_THREADS=N
# their runtime's worker threads (0: every core; 1: one thread), VFABRIC_PEER_THREADS the peer's alone.
# VFABRIC_BENCH=lease-routes runs `vfabric-bench lease-routes` instead of `remote` (no iperf3). With NCCL_HOSTID
# set, the peer's agent names its host "$NCCL_HOSTID-peer" (two agents on one GPU then join NCCL channels).
# VFABRIC_PEER_LOG=FILE keeps the peer agent's log there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
mode=${1:?usage: scripts/remote-bench-procs.sh loopback|netns [args...]}
shift
BIN=${VFABRIC_BIN:-target/release}
work=$(mktemp -d)
pids=()
export VF_NETNS_PREFIX="vfr$$"
VF_NETNS_PREFIX=${VF_NETNS_PREFIX:0:12}
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -n "${VFABRIC_PEER_LOG:-}" ] && [ -f "$work/n1.log" ]; then cp "$work/n1.log" "$VFABRIC_PEER_LOG"; fi
    [ "$mode" = netns ] && scripts/netns.sh down >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
this=n0
peer=n1
case $mode in
    # The largest packet each path carries: quinn's largest on loopback, jumbo frames (9000 - 28) on the veths.
    loopback) a0=127.0.0.1:7710; a1=127.0.0.1:7750; peer_ip=127.0.0.1; mtu=16383 ;;
    netns) a0=10.77.0.1:7700; a1=10.77.0.2:7700; peer_ip=10.77.0.2; mtu=8972 ;;
    config)
        src=${1:?usage: scripts/remote-bench-procs.sh config FILE THIS PEER [args...]}
        this=${2:?this node}; peer=${3:?peer node}; shift 3
        peer_ip=127.0.0.1 ;;
    *) echo "mode: loopback, netns or config" >&2; exit 2 ;;
esac
if [ "$mode" = config ]; then
    sed "s|^certs = .*|certs = \"$work/certs\"|" "$src" > "$work/cluster.toml"
else
cat > "$work/cluster.toml" <<TOML
[cluster]
name = "remote-bench"
[device]
backend = "emulated"
emulated_gpus = 1
emulated_gpu_memory = "1GiB"
[memory]
gpu_budget = "512MiB"
host_arena = "768MiB"
[network]
mtu = ${VFABRIC_MTU:-$mtu}
certs = "$work/certs"
heartbeat_ms = 1000
dead_after_ms = 30000
[[node]]
name = "n0"
address = "$a0"
[[node]]
name = "n1"
address = "$a1"
TOML
fi
# VFABRIC_LANES: network.lanes, for both ends.
set_key() { # SECTION KEY VALUE: sets KEY of [SECTION] in the configuration (the section must be there)
    sed -i -e "/^\[$1\]\$/,/^\[/{/^$2 *=/d}" -e "s/^\[$1\]\$/[$1]\n$2 = $3/" "$work/cluster.toml"
}
set_keys() { # SECTION 'key = value; ...'
    local kv k v
    IFS=';' read -ra kvs <<< "$2"
    for kv in "${kvs[@]}"; do
        k=$(echo "${kv%%=*}" | tr -d ' '); v=$(echo "${kv#*=}" | sed 's/^ *//; s/ *$//')
        if [ -n "$k" ]; then set_key "$1" "$k" "$v"; fi
    done
}
[ -n "${VFABRIC_LANES:-}" ] && set_key network lanes "$VFABRIC_LANES"
# VFABRIC_NETWORK / VFABRIC_MEMORY='key = value; ...': other [network] or [memory] settings, e.g.
# VFABRIC_NETWORK='socket_buffer = "4MiB"' or VFABRIC_MEMORY='page_size = "64KiB"' (regions of 64 KiB pages).
set_keys network "${VFABRIC_NETWORK:-}"
set_keys memory "${VFABRIC_MEMORY:-}"
"$BIN/vfabric" cluster init --config "$work/cluster.toml" > /dev/null || exit 1
run() { # I CMD...: in node I's namespace, or here. Execs, so that `run ... &` gives the command's own PID.
    local i=$1; shift
    if [ "$mode" = netns ]; then exec scripts/netns.sh exec "$i" "$@"; else exec "$@"; fi
}
if [ "$mode" = netns ]; then scripts/netns.sh up 2 > /dev/null || exit 1; fi
peer_env=()
if [ -n "${NCCL_HOSTID:-}" ]; then peer_env=(NCCL_HOSTID="$NCCL_HOSTID-peer"); fi
run 1 env "${peer_env[@]}" "$BIN/vfabric" agent --config "$work/cluster.toml" --node "$peer" \
    --threads "${VFABRIC_PEER_THREADS:-${VFABRIC_AGENT_THREADS:-0}}" > "$work/n1.log" 2>&1 &
pids+=($!)
# The iperf3 baseline: a server on the peer's side, unless the arguments skip it or there is no iperf3.
iperf=()
case " $* " in *" --iperf-seconds 0 "*) skip_iperf=1 ;; *) skip_iperf=0 ;; esac
bench=${VFABRIC_BENCH:-remote}
[ "$bench" = remote ] || skip_iperf=1
if [ $skip_iperf = 0 ] && command -v iperf3 > /dev/null; then
    run 1 iperf3 -s -B "$peer_ip" > /dev/null 2>&1 &
    pids+=($!)
    iperf=(--iperf-server "$peer_ip")
elif [ $skip_iperf = 0 ]; then
    echo "no iperf3 on PATH: the TCP baseline is skipped" >&2
    iperf=(--iperf-seconds 0)
fi
for _ in $(seq 300); do grep -q "listening on" "$work/n1.log" && break; sleep 0.1; done
if ! grep -q "listening on" "$work/n1.log"; then echo "the peer agent did not start:"; cat "$work/n1.log"; exit 1; fi
if [ "$bench" = remote ]; then
    (run 0 "$BIN/vfabric-bench" remote --cluster "$work/cluster.toml" --node "$this" --peer "$peer" "${iperf[@]}" \
        --threads "${VFABRIC_AGENT_THREADS:-0}" "$@")
else
    (run 0 "$BIN/vfabric-bench" "$bench" --cluster "$work/cluster.toml" --node "$this" --peer "$peer" "$@")
fi
