#!/usr/bin/env bash
# A small multi-node network for tests on one machine: network namespaces joined by a bridge.
#
#   scripts/netns.sh up [N]          N nodes (default 3): namespaces PREFIX-n0..PREFIX-n{N-1} plus PREFIX-sw
#                                    holding bridge br0; node i has 10.77.0.(i+1)/24 on eth0 (MTU 9000), lo up
#   scripts/netns.sh down            remove every PREFIX-n<i> / PREFIX-sw namespace (TERM, then KILL after 2 s,
#                                    the processes still inside them, by PID); succeeds if already gone
#   scripts/netns.sh exec I CMD...   run CMD inside node I (exec ip netns exec PREFIX-nI CMD...)
#   scripts/netns.sh addr I          print node I's address, 10.77.0.(I+1)
#   scripts/netns.sh partition I J   drop all traffic between node I and node J (nft table inet vfabric, both nodes)
#   scripts/netns.sh heal            delete the vfabric nft table on every node (partitions and loss)
#   scripts/netns.sh loss I PCT      drop PCT% (0..100) of packets arriving at node I on eth0; 0 removes the rule
#   scripts/netns.sh status          list the namespaces, their addresses and nft rules
#
# PREFIX is ${VF_NETNS_PREFIX:-vf}. Needs root, `ip` (Debian package iproute2) and, for partition/heal/loss,
# `nft` (Debian package nftables). Nothing is created in the root namespace: each veth pair is made inside
# PREFIX-sw (n<i>-br / n<i>-eth, short fixed names, so the 15-character limit never depends on the prefix),
# and the n<i>-eth end is moved into node i and renamed eth0. Deleting the namespaces removes all of it.
#
# nft layout on a node (table inet vfabric):
#   set partitioned   addresses of the peers cut off from this node
#   chain input       hook input:  ip saddr @partitioned drop
#   chain output      hook output: ip daddr @partitioned drop
#   chain loss        hook input:  iifname "eth0" numgen random mod 100 < PCT drop  (PCT 100: iifname "eth0" drop)
#
# Exit status: 0 ok, 1 failure (message on stderr), 2 bad usage.
set -euo pipefail

PROG=${0##*/}
SELF=$0
PREFIX=${VF_NETNS_PREFIX:-vf}
SUBNET=10.77.0
BRIDGE=br0
MTU=9000
MAX_NODES=254
TABLE=vfabric

usage() {
    cat >&2 <<EOF
usage: $PROG up [N]            create N nodes (default 3; 1..$MAX_NODES)
       $PROG down              remove the namespaces (and processes left in them)
       $PROG exec I CMD...     run CMD inside node I
       $PROG addr I            print node I's address
       $PROG partition I J     drop all traffic between nodes I and J
       $PROG heal              remove all partitions and loss rules
       $PROG loss I PCT        drop PCT% (0..100) of packets arriving at node I; 0 removes it
       $PROG status            list namespaces, addresses and nft rules
namespaces: \${VF_NETNS_PREFIX:-vf}-n0.. and -sw (now: $PREFIX-*)
EOF
    exit 2
}

die() { echo "$PROG: error: $*" >&2; exit 1; }
warn() { echo "$PROG: warning: $*" >&2; }
info() { echo "$PROG: $*" >&2; }
bad() { echo "$PROG: $*" >&2; usage; }

need_root() {
    [[ ${EUID:-$(id -u)} -eq 0 ]] || die "must run as root (network namespaces need CAP_SYS_ADMIN)"
}
need_ip() {
    command -v ip >/dev/null 2>&1 || die "'ip' not found; install the Debian package iproute2 (apt-get install -y iproute2)"
}
need_nft() {
    command -v nft >/dev/null 2>&1 || die "'nft' not found; install the Debian package nftables (apt-get install -y nftables)"
}

check_prefix() {
    [[ $PREFIX =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$ ]] \
        || bad "VF_NETNS_PREFIX='$PREFIX' must be 1-40 characters of [A-Za-z0-9_.-], starting alphanumeric"
}

# A decimal index without leading zeros (bash would read 08 as bad octal).
is_uint() { [[ $1 =~ ^(0|[1-9][0-9]{0,5})$ ]]; }

node_index() { # $1 = the argument; checks syntax and range only
    if ! { is_uint "$1" && (($1 < MAX_NODES)); }; then bad "bad node index '$1' (0..$((MAX_NODES - 1)))"; fi
}

ns_node() { echo "$PREFIX-n$1"; }
ns_sw() { echo "$PREFIX-sw"; }
node_addr() { echo "$SUBNET.$(($1 + 1))"; }

# Every namespace of this prefix: PREFIX-sw and PREFIX-n<digits>, nothing else (so prefix "vf" leaves "vf-x-n0").
list_ns() {
    local name rest
    { while read -r name _; do
        [[ -n $name ]] || continue
        if [[ $name == "$PREFIX-sw" ]]; then
            echo "$name"
        elif [[ $name == "$PREFIX-n"* ]]; then
            rest=${name#"$PREFIX-n"}
            if is_uint "$rest"; then echo "$name"; fi
        fi
    done < <(ip netns list 2>/dev/null || true); } | sort -V
    return 0
}

# Node indices present, ascending.
list_nodes() {
    local ns
    while read -r ns; do
        [[ $ns == "$PREFIX-sw" ]] || echo "${ns#"$PREFIX-n"}"
    done < <(list_ns) | sort -n
}

ns_exists() { # (no grep -q on a pipe: with pipefail the writer's SIGPIPE would fail the test)
    [[ -e /run/netns/$1 ]] && return 0
    local name
    while read -r name _; do [[ $name == "$1" ]] && return 0; done < <(ip netns list 2>/dev/null || true)
    return 1
}

need_node() { # $1 = index (already syntax-checked)
    ns_exists "$(ns_node "$1")" || die "node $1 does not exist (no namespace $(ns_node "$1")); run '$SELF up' (VF_NETNS_PREFIX=$PREFIX)"
}

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# ---------------------------------------------------------------- down

alive() { # $1 = pid; a zombie counts as gone
    local state
    [[ -r /proc/$1/stat ]] || return 1
    state=$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

do_down() {
    local quiet=${1:-}
    local -a nss=() pids=() left=()
    local ns pid i
    mapfile -t nss < <(list_ns)
    if ((${#nss[@]} == 0)); then
        [[ -n $quiet ]] || info "no namespaces with prefix '$PREFIX-'; nothing to do"
        return 0
    fi
    for ns in "${nss[@]}"; do
        while read -r pid; do
            [[ $pid =~ ^[0-9]+$ ]] || continue
            [[ $pid -eq $$ || $pid -eq $BASHPID ]] && continue
            pids+=("$pid")
        done < <(ip netns pids "$ns" 2>/dev/null || true)
    done
    if ((${#pids[@]} > 0)); then
        info "sending TERM to ${#pids[@]} process(es) left in the namespaces: ${pids[*]}"
        kill -TERM "${pids[@]}" 2>/dev/null || true
        for ((i = 0; i < 20; i++)); do
            left=()
            for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
            ((${#left[@]} == 0)) && break
            sleep 0.1
        done
        if ((${#left[@]} > 0)); then
            info "sending KILL to ${left[*]} (still alive after 2 s)"
            kill -KILL "${left[@]}" 2>/dev/null || true
        fi
    fi
    local failed=0
    for ns in "${nss[@]}"; do
        if ip netns del "$ns" 2>/dev/null || ! ns_exists "$ns"; then
            [[ -n $quiet ]] || info "removed namespace $ns"
        else
            warn "could not remove namespace $ns"
            failed=1
        fi
    done
    ((failed == 0)) || die "some namespaces with prefix '$PREFIX-' remain (see 'ip netns list')"
}

# ---------------------------------------------------------------- up

UP_DONE=0
up_cleanup() {
    local rc=$?
    if ((UP_DONE == 0)); then
        warn "'up' failed (exit $rc); removing the namespaces it made"
        do_down quiet || true
        ((rc != 0)) || rc=1
    fi
    exit "$rc"
}

do_up() {
    local n=$1 i ns sw existing
    existing=$(list_ns | tr '\n' ' ')
    [[ -z $existing ]] || die "namespaces with prefix '$PREFIX-' already exist: ${existing% }; run '$SELF down' first (or set VF_NETNS_PREFIX)"

    trap up_cleanup EXIT
    trap 'echo "$PROG: error: up: \"$BASH_COMMAND\" failed (line $LINENO)" >&2' ERR
    sw=$(ns_sw)
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add "$BRIDGE" type bridge
    ip -n "$sw" link set "$BRIDGE" mtu "$MTU" up
    for ((i = 0; i < n; i++)); do
        ns=$(ns_node "$i")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$sw" link add "n$i-br" mtu "$MTU" type veth peer name "n$i-eth" mtu "$MTU"
        ip -n "$sw" link set "n$i-eth" netns "$ns"
        ip -n "$ns" link set "n$i-eth" name eth0
        ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$sw" link set "n$i-br" master "$BRIDGE" up
    done
    UP_DONE=1
    trap - EXIT ERR
    info "up: $n node(s) $(ns_node 0)..$(ns_node $((n - 1))) on $SUBNET.1..$SUBNET.$n/24, switch $sw ($BRIDGE), MTU $MTU"
}

# ---------------------------------------------------------------- nft

has_table() { in_ns "$1" nft list table inet "$TABLE" >/dev/null 2>&1; }

nft_partition() { # $1 = namespace, $2 = peer address
    in_ns "$1" nft -f - <<EOF
add table inet $TABLE
add set inet $TABLE partitioned { type ipv4_addr; }
add chain inet $TABLE input { type filter hook input priority 0; policy accept; }
add chain inet $TABLE output { type filter hook output priority 0; policy accept; }
flush chain inet $TABLE input
flush chain inet $TABLE output
add rule inet $TABLE input ip saddr @partitioned drop
add rule inet $TABLE output ip daddr @partitioned drop
add element inet $TABLE partitioned { $2 }
EOF
}

do_partition() {
    local i=$1 j=$2
    need_node "$i"
    need_node "$j"
    nft_partition "$(ns_node "$i")" "$(node_addr "$j")" || die "nft failed on node $i"
    nft_partition "$(ns_node "$j")" "$(node_addr "$i")" || die "nft failed on node $j"
    info "partitioned node $i ($(node_addr "$i")) from node $j ($(node_addr "$j"))"
}

do_heal() {
    local i ns n=0
    local -a nodes=()
    mapfile -t nodes < <(list_nodes)
    ((${#nodes[@]} > 0)) || die "no nodes with prefix '$PREFIX-'; run '$SELF up' first"
    for i in "${nodes[@]}"; do
        ns=$(ns_node "$i")
        if has_table "$ns"; then
            in_ns "$ns" nft delete table inet "$TABLE" || die "could not delete nft table $TABLE on node $i"
            n=$((n + 1))
        fi
    done
    info "healed: removed the $TABLE table from $n node(s)"
}

do_loss() {
    local i=$1 pct=$2 ns
    need_node "$i"
    ns=$(ns_node "$i")
    if ((pct == 0)); then
        if in_ns "$ns" nft list chain inet "$TABLE" loss >/dev/null 2>&1; then
            in_ns "$ns" nft delete chain inet "$TABLE" loss || die "could not remove the loss chain on node $i"
        fi
        info "loss on node $i removed"
        return 0
    fi
    # nft rejects "numgen random mod 100 < 100" (value out of the 0-99 range), so 100% is a plain drop.
    local match="numgen random mod 100 < $pct "
    ((pct < 100)) || match=""
    in_ns "$ns" nft -f - <<EOF || die "nft failed on node $i"
add table inet $TABLE
add chain inet $TABLE loss { type filter hook input priority 0; policy accept; }
flush chain inet $TABLE loss
add rule inet $TABLE loss iifname "eth0" ${match}drop
EOF
    info "node $i ($(node_addr "$i")) now drops $pct% of arriving packets"
}

# ---------------------------------------------------------------- status

do_status() {
    local ns i
    local -a nss=() nodes=()
    mapfile -t nss < <(list_ns)
    if ((${#nss[@]} == 0)); then
        echo "no namespaces with prefix '$PREFIX-'"
        return 0
    fi
    local have_nft=1
    command -v nft >/dev/null 2>&1 || have_nft=0
    mapfile -t nodes < <(list_nodes)
    echo "prefix '$PREFIX': ${#nodes[@]} node(s); namespaces: ${nss[*]}"
    if ns_exists "$(ns_sw)"; then
        echo "$(ns_sw): bridge ports: $(ip -n "$(ns_sw)" -o link show master "$BRIDGE" 2>/dev/null \
            | awk -F': ' '{sub(/@.*/, "", $2); printf "%s ", $2}')"
    else
        echo "$(ns_sw): MISSING"
    fi
    for i in "${nodes[@]}"; do
        ns=$(ns_node "$i")
        local br mtu
        br=$(ip -n "$ns" -br addr show dev eth0 2>/dev/null | awk '{sub(/@.*/, "", $1); print $1, $2, $3}') || true
        mtu=$(ip -n "$ns" -o link show dev eth0 2>/dev/null | sed -nE 's/.* mtu ([0-9]+) .*/\1/p') || true
        echo "$ns: ${br:-eth0 missing}${mtu:+ mtu $mtu}"
        if ((have_nft == 0)); then
            echo "  nft: (nft not installed: Debian package nftables)"
        elif has_table "$ns"; then
            in_ns "$ns" nft list table inet "$TABLE" | sed 's/^/  /'
        else
            echo "  nft: no $TABLE table"
        fi
    done
}

# ---------------------------------------------------------------- main

trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

(($# >= 1)) || usage
cmd=$1
shift
case $cmd in
    -h | --help | help)
        usage
        ;;
    up)
        (($# <= 1)) || bad "up takes at most one argument"
        n=${1:-3}
        if ! { is_uint "$n" && ((n >= 1 && n <= MAX_NODES)); }; then bad "bad node count '$n' (1..$MAX_NODES)"; fi
        check_prefix; need_root; need_ip
        do_up "$n"
        ;;
    down)
        (($# == 0)) || bad "down takes no arguments"
        check_prefix; need_root; need_ip
        do_down
        ;;
    exec)
        (($# >= 2)) || bad "exec needs a node index and a command"
        node_index "$1"
        check_prefix; need_root; need_ip
        need_node "$1"
        ns=$(ns_node "$1")
        shift
        exec ip netns exec "$ns" "$@"
        ;;
    addr)
        (($# == 1)) || bad "addr takes one node index"
        node_index "$1"
        node_addr "$1"
        ;;
    partition)
        (($# == 2)) || bad "partition takes two node indices"
        node_index "$1"
        node_index "$2"
        [[ $1 != "$2" ]] || bad "partition needs two different nodes"
        check_prefix; need_root; need_ip; need_nft
        do_partition "$1" "$2"
        ;;
    heal)
        (($# == 0)) || bad "heal takes no arguments"
        check_prefix; need_root; need_ip; need_nft
        do_heal
        ;;
    loss)
        (($# == 2)) || bad "loss takes a node index and a percentage"
        node_index "$1"
        if ! { is_uint "$2" && (($2 <= 100)); }; then bad "bad percentage '$2' (0..100)"; fi
        check_prefix; need_root; need_ip; need_nft
        do_loss "$1" "$2"
        ;;
    status)
        (($# == 0)) || bad "status takes no arguments"
        check_prefix; need_ip
        do_status
        ;;
    *)
        bad "unknown command '$cmd'"
        ;;
esac
