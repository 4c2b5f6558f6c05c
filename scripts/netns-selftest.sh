#!/usr/bin/env bash
# Self-test of scripts/netns.sh: brings up 3 nodes under a unique prefix, checks reachability, partition/heal,
# loss, jumbo frames and teardown. Prints PASS/FAIL per check; exits 1 if any check failed. Needs root.
#
# Reachability probe: `ping -c1 -W1` when ping is installed, else a TCP connect (python3 -c) to a
# `python3 -m http.server` started in every node (PIDs recorded). VF_SELFTEST_PROBE=ping|tcp forces one.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETNS=$HERE/netns.sh
PREFIX=vft$$
PREFIX=${PREFIX:0:12}
export VF_NETNS_PREFIX=$PREFIX
PORT=18077
UDP_PORT=18078

FAILS=0
PASSES=0
STARTED=() # PIDs of the processes this script started inside the namespaces

pass() { echo "PASS $*"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
check() { # check NAME CMD... : PASS when CMD succeeds
    local name=$1
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}
check_not() { # check_not NAME CMD... : PASS when CMD fails
    local name=$1
    shift
    if "$@"; then fail "$name"; else pass "$name"; fi
}

alive() { # a zombie counts as gone
    local state
    state=$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

cleanup() {
    local rc=$? pid
    trap - EXIT
    for pid in "${STARTED[@]}"; do
        if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    "$NETNS" down >/dev/null 2>&1 || echo "selftest: warning: '$NETNS down' failed in cleanup (prefix $PREFIX)" >&2
    for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

die() { echo "selftest: error: $*" >&2; echo "FAIL prerequisites"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
command -v ip >/dev/null 2>&1 || die "'ip' missing: install the Debian package iproute2"
command -v nft >/dev/null 2>&1 || die "'nft' missing: install the Debian package nftables"
HAVE_PY=0
command -v python3 >/dev/null 2>&1 && HAVE_PY=1

PROBE=${VF_SELFTEST_PROBE:-}
if [[ -z $PROBE ]]; then
    if command -v ping >/dev/null 2>&1; then PROBE=ping; else PROBE=tcp; fi
fi
case $PROBE in
    ping) command -v ping >/dev/null 2>&1 || die "VF_SELFTEST_PROBE=ping but ping is not installed (iputils-ping)" ;;
    tcp) ((HAVE_PY)) || die "neither ping nor python3 is installed; need one of them (iputils-ping or python3)" ;;
    *) die "VF_SELFTEST_PROBE must be ping or tcp" ;;
esac
echo "selftest: prefix $PREFIX, probe $PROBE"

addr() { "$NETNS" addr "$1"; }

# reach I J: can node I reach node J?
reach() {
    local target
    target=$(addr "$2")
    if [[ $PROBE == ping ]]; then
        "$NETNS" exec "$1" ping -n -q -c1 -W1 "$target" >/dev/null 2>&1
    else
        "$NETNS" exec "$1" python3 -c '
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(1)
' "$target" "$PORT" >/dev/null 2>&1
    fi
}

# udp_count I J SIZE COUNT: send COUNT datagrams of SIZE bytes (don't fragment) from node I to node J;
# prints how many arrived.
udp_count() {
    local i=$1 j=$2 size=$3 count=$4 out pid n
    out=$(mktemp)
    "$NETNS" exec "$j" python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
s.settimeout(3)
n = 0
try:
    while True:
        s.recv(65535)
        n += 1
        s.settimeout(0.5)
except socket.timeout:
    pass
print(n, flush=True)
' "$(addr "$j")" "$UDP_PORT" >"$out" 2>/dev/null &
    pid=$!
    STARTED+=("$pid")
    for _ in $(seq 50); do grep -q ready "$out" && break; sleep 0.1; done
    "$NETNS" exec "$i" python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: never fragment
data = b"x" * int(sys.argv[3])
for k in range(int(sys.argv[4])):
    s.sendto(data, (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.001)  # stay well inside the receiving socket buffer
' "$(addr "$j")" "$UDP_PORT" "$size" "$count" >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    n=$(sed -n 2p "$out")
    rm -f "$out"
    echo "${n:-0}"
}

nodes_mesh() { # every node reaches every other
    local i j ok=0
    for i in 0 1 2; do
        for j in 0 1 2; do
            ((i == j)) && continue
            if reach "$i" "$j"; then
                pass "reach $i->$j"
            else
                fail "reach $i->$j"
                ok=1
            fi
        done
    done
    return "$ok"
}

prefix_namespaces() { ip netns list | awk '{print $1}' | grep -E "^${PREFIX}-(sw|n[0-9]+)$" || true; }

# ---------------------------------------------------------------- up

if "$NETNS" up 3; then pass "up 3"; else fail "up 3"; exit 1; fi
check "namespaces ${PREFIX}-n0..n2 and ${PREFIX}-sw exist" \
    test "$(prefix_namespaces | sort | tr '\n' ' ')" = "${PREFIX}-n0 ${PREFIX}-n1 ${PREFIX}-n2 ${PREFIX}-sw "
check_not "second up fails (namespaces exist)" "$NETNS" up 3
check "addr 1 is 10.77.0.2" test "$(addr 1)" = 10.77.0.2
eth0_ok() { # node I has 10.77.0.(I+1)/24 on eth0, MTU 9000, lo up
    local link addrs lo
    link=$("$NETNS" exec "$1" ip -o link show dev eth0) || return 1
    addrs=$("$NETNS" exec "$1" ip -o addr show dev eth0) || return 1
    lo=$("$NETNS" exec "$1" ip -o link show dev lo) || return 1
    [[ $link == *" mtu 9000 "* && $addrs == *" $(addr "$1")/24 "* && $lo =~ [\<,]UP[,\>] ]]
}
for i in 0 1 2; do check "node $i: eth0 $(addr "$i")/24 mtu 9000, lo up" eth0_ok "$i"; done
usage_exits_2() {
    local rc=0
    "$NETNS" partition 0 0 2>/dev/null || rc=$?
    ((rc == 2))
}
check "bad usage (partition 0 0) exits 2" usage_exits_2

# processes inside the namespaces: servers for the tcp probe, and a sleeper for the down check
if [[ $PROBE == tcp ]]; then
    for i in 0 1 2; do
        "$NETNS" exec "$i" python3 -m http.server "$PORT" --bind "$(addr "$i")" >/dev/null 2>&1 &
        STARTED+=("$!")
    done
    for i in 0 1 2; do
        for _ in $(seq 100); do reach "$i" "$i" && break; sleep 0.1; done
        check "http.server on node $i listening" reach "$i" "$i"
    done
fi
"$NETNS" exec 2 sleep 600 &
STARTED+=("$!")

# ---------------------------------------------------------------- connectivity, partition, heal, loss

nodes_mesh || true

if ((HAVE_PY)); then
    n=$(udp_count 0 1 8972 20)
    check "jumbo: 20 x 8972-byte UDP datagrams (DF) 0->1 arrive ($n)" test "$n" -eq 20
else
    echo "SKIP jumbo UDP (no python3)"
fi

check "partition 0 1" "$NETNS" partition 0 1
check_not "partitioned: 0->1 fails" reach 0 1
check_not "partitioned: 1->0 fails" reach 1 0
check "partitioned: 0->2 works" reach 0 2
check "partitioned: 1->2 works" reach 1 2
status_has() { # status succeeds and its output contains $1
    local out
    out=$("$NETNS" status) && [[ $out == *"$1"* ]]
}
check "status shows the partition" status_has "ip saddr @partitioned drop"
check "heal" "$NETNS" heal
check "healed: 0->1 works" reach 0 1
check "healed: 1->0 works" reach 1 0

check "loss 1 100" "$NETNS" loss 1 100
check_not "loss 100%: 0->1 fails" reach 0 1
check_not "loss 100%: 2->1 fails" reach 2 1
check "loss 100% on node 1: 0->2 works" reach 0 2
if ((HAVE_PY)); then
    "$NETNS" loss 1 50 >/dev/null 2>&1
    n=$(udp_count 0 1 100 400)
    check "loss 50%: 400 datagrams 0->1, $n arrived (expect 120..280)" test "$n" -ge 120 -a "$n" -le 280
fi
check "loss 1 0" "$NETNS" loss 1 0
check "loss removed: 0->1 works" reach 0 1
check "loss removed: 2->1 works" reach 2 1

check "status lists node 2's address" status_has "10.77.0.3/24"

# ---------------------------------------------------------------- down

check "down" "$NETNS" down
check "no namespace with prefix $PREFIX left (ip netns list)" test -z "$(prefix_namespaces)"
procs_gone() {
    local pid
    for pid in "${STARTED[@]}"; do
        if alive "$pid"; then return 1; fi
    done
}
check "down ended the processes left inside (${#STARTED[@]}: ${STARTED[*]})" procs_gone
check "down again succeeds (already gone)" "$NETNS" down

echo "selftest: $PASSES passed, $FAILS failed"
if ((FAILS > 0)); then
    echo "FAIL netns selftest"
    exit 1
fi
echo "PASS netns selftest"
