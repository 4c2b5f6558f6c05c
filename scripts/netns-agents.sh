#!/usr/bin/env bash
# Three vfabric agents in three network namespaces (scripts/netns.sh), checked from a fourth run of node n0:
#   1. every peer serves a remote alloc / write / read / free, every byte equal;
#   2. with n0 and n2 partitioned (nft drop), n1 still works and n2 fails with a clear error, not a hang;
#   3. with 5% of the packets arriving at n1 dropped, every byte still arrives verified (throughput printed);
#   4. with n2's agent stopped by SIGTERM (it shuts down cleanly), n1 still works and n2 fails clearly;
#   and `vfabric status` of n2 through n1's agent (over QUIC), while n2 runs and after it stopped.
# Usage: scripts/netns-agents.sh PATH/TO/vfabric     (as root; needs iproute2 and nftables)
# Ends only the processes it started (by PID) and removes its namespaces, also when it fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BIN=${1:?usage: scripts/netns-agents.sh PATH/TO/vfabric}
# What this needs, checked before anything starts, each missing piece named with how to get it.
missing=0
need() { # TOOL PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "netns-agents: error: '$1' not found on PATH; install the Debian/Ubuntu package $2 (apt-get install -y $2)," \
        "or run 'bash .ci/run', which installs it" >&2
    missing=1
}
need ip iproute2
need nft nftables
if [ "$(id -u)" != 0 ]; then
    echo "netns-agents: error: must run as root (network namespaces need CAP_SYS_ADMIN): sudo $0 $BIN" >&2
    missing=1
fi
[ -x "$BIN" ] || { echo "netns-agents: error: $BIN is not an executable vfabric binary" >&2; missing=1; }
if [ "$missing" != 0 ]; then echo "FAIL netns agents: prerequisites missing"; exit 1; fi
export VF_NETNS_PREFIX="vfa$$"
VF_NETNS_PREFIX=${VF_NETNS_PREFIX:0:12}
work=$(mktemp -d)
declare -A pids=()
failures=0

cleanup() {
    for p in "${pids[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    scripts/netns.sh down >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

check() { # NAME CONDITION-RESULT
    if [ "$2" = 0 ]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

sed "s|^certs = .*|certs = \"$work/certs\"|" cluster-configs/netns-3node.toml > "$work/cluster.toml"
"$BIN" cluster init --config "$work/cluster.toml" > "$work/init.log" 2>&1 || { cat "$work/init.log"; exit 1; }
scripts/netns.sh up 3 || exit 1

start_agent() { # I
    scripts/netns.sh exec "$1" "$BIN" agent --config "$work/cluster.toml" --node "n$1" > "$work/n$1.log" 2>&1 &
    pids[$1]=$!
    for _ in $(seq 100); do
        grep -q "listening on" "$work/n$1.log" && return 0
        kill -0 "${pids[$1]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "agent n$1 did not start:"; cat "$work/n$1.log"; return 1
}

probe() { # BYTES -> output in $work/probe.log, status returned
    scripts/netns.sh exec 0 "$BIN" cluster probe --config "$work/cluster.toml" --node n0 --bytes "$1" > "$work/probe.log" 2>&1
}

start_agent 1 && start_agent 2 || exit 1

probe 8MiB; rc=$?
cat "$work/probe.log"
check "all peers serve n0" "$([ $rc = 0 ] && grep -q '^peer n1: ok' "$work/probe.log" && grep -q '^peer n2: ok' "$work/probe.log"; echo $?)"

# A node's status asked through another node's agent, which asks it over QUIC (the agents' sockets are files, which
# every namespace sees; the network between them is the namespaces').
"$BIN" status --config "$work/cluster.toml" --node n2 --via n1 --json > "$work/status.json" 2> "$work/status.err"; rc=$?
cat "$work/status.err"
check "n2's status through n1's agent over QUIC" \
    "$([ $rc = 0 ] && grep -q '"node":2,"name":"n2"' "$work/status.json" &&
        grep -q '"name":"n1","address":"[^"]*","state":"alive"' "$work/status.json"; echo $?)"

scripts/netns.sh partition 0 2
probe 8MiB; rc=$?
cat "$work/probe.log"
check "partitioned from n2: n1 still serves, n2 fails clearly" \
    "$([ $rc != 0 ] && grep -q '^peer n1: ok' "$work/probe.log" && grep -q '^peer n2: FAILED: .*not answering' "$work/probe.log"; echo $?)"
scripts/netns.sh heal

scripts/netns.sh loss 1 5
probe 32MiB; rc=$?
cat "$work/probe.log"
check "5% loss into n1: every byte arrives verified" "$([ $rc = 0 ] && grep -q '^peer n1: ok' "$work/probe.log"; echo $?)"
scripts/netns.sh loss 1 0

kill -TERM "${pids[2]}"
wait "${pids[2]}"; rc=$?
unset 'pids[2]'
check "n2's agent stops cleanly on SIGTERM" "$([ $rc = 0 ] && grep -q '^stopping' "$work/n2.log"; echo $?)"
probe 8MiB; rc=$?
cat "$work/probe.log"
check "n2 stopped: n1 still serves, n2 fails clearly" \
    "$([ $rc != 0 ] && grep -q '^peer n1: ok' "$work/probe.log" && grep -q '^peer n2: FAILED' "$work/probe.log"; echo $?)"
"$BIN" status --config "$work/cluster.toml" --node n2 --via n1 > "$work/status.log" 2>&1; rc=$?
cat "$work/status.log"
check "n2 stopped: its status through n1 fails clearly" "$([ $rc != 0 ] && grep -q "node n2's status: " "$work/status.log"; echo $?)"

if [ "$failures" -gt 0 ]; then
    echo "agent logs:"; for f in "$work"/n*.log; do echo "--- $f"; tail -20 "$f"; done
    echo "FAIL: $failures check(s)"
    exit 1
fi
echo "PASS netns agents"
