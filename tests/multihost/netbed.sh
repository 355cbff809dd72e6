#!/usr/bin/env bash
# A test bed of N "hosts" on this machine (docs/design.md §8.11): each host is
# a network namespace with its own network stack and, through `unshare --uts`,
# its own host name; a veth pair joins it to a bridge in a namespace of its
# own, so no address of the bed is seen by the root namespace and two beds
# (ctest -j2) never meet. Open MPI starts its daemons into the hosts through
# the rsh agent this script writes, and its TCP transport crosses the veths.
#
#   netbed.sh up PREFIX N DIR     create PREFIX-br, PREFIX-h1..hN; write DIR/hostfile,
#                                 DIR/agent (the rsh agent) and DIR/env (shell variables)
#   netbed.sh down PREFIX         remove every namespace PREFIX-* and the processes in it
#   netbed.sh with PREFIX N DIR -- COMMAND...
#                                 up, run COMMAND with NETBED_* in its environment,
#                                 down on every exit (trap EXIT, also on INT/TERM);
#                                 leftovers of an earlier run with PREFIX are removed first
#   netbed.sh link PREFIX HOST up|down
#                                 host HOST's link to the bridge up (back when host 1
#                                 reaches it again) or down (a network fault)
#   netbed.sh on PREFIX HOST -- COMMAND...
#                                 COMMAND inside host HOST (1..N) under its host name
#
# Addresses: 10.77.0.i/24 for host i, used only inside the bed's namespaces
# (check with `ip -br addr` in the root namespace: nothing there is 10.77.*).
# Where namespaces cannot be made (not root, no `ip netns`), `up` and `with`
# print "SKIP netbed: <why>" and exit 77 (CTest's SKIP_RETURN_CODE).
set -u
SUBNET=10.77.0.0/24
NET=10.77.0
SKIP=77

die() { echo "netbed: $*" >&2; exit 1; }
skip() { echo "SKIP netbed: $*"; exit $SKIP; }

valid_prefix() {
    # ns names and host names: short, no separators a shell or ip would mind
    [[ $1 =~ ^[a-z][a-z0-9]{1,11}$ ]] || die "prefix '$1' must be 2-12 of [a-z0-9], starting with a letter"
}

can_make_namespaces() {
    [ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (uid $(id -u))"
    command -v ip >/dev/null 2>&1 || skip "iproute2 'ip' not found"
    command -v unshare >/dev/null 2>&1 || skip "util-linux 'unshare' not found"
    local probe=nbprobe$$
    ip netns add "$probe" 2>/dev/null || skip "'ip netns add' failed (no network namespaces here)"
    ip netns del "$probe"
}

# Every namespace of the bed: PREFIX-br, PREFIX-h1, ...
bed_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(br|h[0-9]+)$"; }

down() {
    local prefix=$1 ns pids
    valid_prefix "$prefix"
    for ns in $(bed_namespaces "$prefix"); do
        # processes keep a namespace (and its veth) alive after `ip netns del`
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    done
    for ns in $(bed_namespaces "$prefix"); do
        for _ in 1 2 3 4 5; do
            pids=$(ip netns pids "$ns" 2>/dev/null)
            [ -z "$pids" ] && break
            kill -9 $pids 2>/dev/null
            sleep 0.2
        done
        ip netns del "$ns" 2>/dev/null
    done
    local left
    left=$(bed_namespaces "$prefix")
    [ -z "$left" ] || { echo "netbed: could not remove: $left" >&2; return 1; }
    return 0
}

up() {
    local prefix=$1 n=$2 dir=$3 i
    valid_prefix "$prefix"
    [[ $n =~ ^[1-9][0-9]?$ ]] && [ "$n" -le 32 ] || die "N '$n' must be 1..32"
    can_make_namespaces
    down "$prefix" || die "leftovers of an earlier bed $prefix remain"
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    local br=$prefix-br
    ip netns add "$br" || die "ip netns add $br failed"
    ip -n "$br" link set lo up
    ip -n "$br" link add br0 type bridge || die "bridge in $br failed"
    ip -n "$br" link set br0 up
    : >"$dir/hostfile"
    for i in $(seq 1 "$n"); do
        local h=$prefix-h$i
        ip netns add "$h" || die "ip netns add $h failed"
        ip -n "$h" link set lo up
        # created inside the namespaces: no name in the root namespace to collide
        ip link add "v$i" netns "$br" type veth peer name eth0 netns "$h" || die "veth for $h failed"
        ip -n "$br" link set "v$i" master br0 up
        ip -n "$h" addr add "$NET.$i/24" dev eth0
        ip -n "$h" link set eth0 up
        echo "$NET.$i slots=8" >>"$dir/hostfile"
    done
    write_agent "$prefix" "$dir"
    cat >"$dir/env" <<EOF
NETBED_PREFIX=$prefix
NETBED_HOSTS=$n
NETBED_SUBNET=$SUBNET
NETBED_DIR=$dir
NETBED_HOSTFILE=$dir/hostfile
NETBED_AGENT=$dir/agent
NETBED_SCRIPT=$(realpath "${BASH_SOURCE[0]}")
EOF
    wait_links "$prefix" "$n" || die "hosts of $prefix do not reach each other"
}

# Open MPI calls the agent as `AGENT [ssh options] ADDRESS COMMAND...` with
# COMMAND meant for a remote shell (it sets PATH, then starts orted).
write_agent() {
    local prefix=$1 dir=$2
    cat >"$dir/agent" <<EOF
#!/bin/sh
# rsh agent of netbed $prefix: ADDRESS $NET.i -> namespace $prefix-hi
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
addr=\$1; shift
i=\${addr##*.}
case \$addr in $NET.*) ;; *) echo "netbed agent: unknown host \$addr" >&2; exit 255 ;; esac
exec ip netns exec $prefix-h\$i unshare --uts sh -c 'hostname "\$0" && eval "\$1"' $prefix-h\$i "\$*"
EOF
    chmod +x "$dir/agent"
}

# The bridge forwards once every port is up: each host reaches the last one
# (no ping here: a TCP connect to a closed port answered "refused" is a reply).
reaches() {
    ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1 | grep -q refused
}

wait_links() {
    local prefix=$1 n=$2 i try
    for i in $(seq 1 "$n"); do
        for try in $(seq 1 20); do
            reaches "$prefix-h$i" "$NET.$n" && break
            [ "$try" -eq 20 ] && return 1
            sleep 0.25
        done
    done
}

link() {
    local prefix=$1 i=$2 state=$3 try
    ip -n "$prefix-br" link set "v$i" "$state" || die "link v$i of $prefix-br: cannot set $state"
    [ "$state" = up ] || return 0
    for try in $(seq 1 40); do
        reaches "$prefix-h1" "$NET.$i" && reaches "$prefix-h$i" "$NET.1" && return 0
        sleep 0.25
    done
    die "host $i of $prefix unreachable after its link came up"
}

on() {
    local prefix=$1 i=$2
    shift 2
    [ "${1:-}" = -- ] && shift
    exec ip netns exec "$prefix-h$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$prefix-h$i" "$@"
}

with() {
    local prefix=$1 n=$2 dir=$3
    shift 3
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "with: no command"
    (up "$prefix" "$n" "$dir") || exit $?
    child=
    trap "down $prefix" EXIT
    trap '[ -n "$child" ] && kill -TERM $child 2>/dev/null; exit 130' INT
    trap '[ -n "$child" ] && kill -TERM $child 2>/dev/null; exit 143' TERM
    set -a
    . "$dir/env"
    set +a
    "$@" &
    child=$!
    # wait returns early on a trapped signal; the EXIT trap then removes the bed
    wait $child
}

case ${1:-} in
up) [ $# -eq 4 ] || die "usage: $0 up PREFIX N DIR"; up "$2" "$3" "$4" ;;
down) [ $# -eq 2 ] || die "usage: $0 down PREFIX"; down "$2" ;;
with) [ $# -ge 5 ] || die "usage: $0 with PREFIX N DIR -- COMMAND..."; shift; with "$@" ;;
link) [ $# -eq 4 ] || die "usage: $0 link PREFIX HOST up|down"; link "$2" "$3" "$4" ;;
on) [ $# -ge 4 ] || die "usage: $0 on PREFIX HOST -- COMMAND..."; shift; on "$@" ;;
*) die "usage: $0 up|down|with|link|on ..." ;;
esac
