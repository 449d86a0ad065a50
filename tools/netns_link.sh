#!/bin/bash
# netns_link.sh — a slower network, simulated on one machine: two network namespaces joined by
# a veth pair whose both directions are rate-limited by a tbf qdisc, and a way to run two MPI
# ranks across it (rank 0 in namespace A, rank 1 in namespace B). Run as root.
#
#   tools/netns_link.sh [OPTIONS] mpi [--] PROGRAM [ARGS...]
#       set the link up, run PROGRAM on 2 ranks across it, print the link's byte counters, tear
#       it down. The launch it makes (hydra MPMD form) is:
#         mpiexec -genv UCX_TLS tcp,self -genv MPIR_CVAR_NOLOCAL 1 \
#           -n 1 -env UCX_NET_DEVICES <devA> ip netns exec <nsA> PROGRAM ARGS : \
#           -n 1 -env UCX_NET_DEVICES <devB> ip netns exec <nsB> PROGRAM ARGS
#   tools/netns_link.sh [OPTIONS] [run] -- COMMAND [ARGS...]
#       set the link up, run COMMAND in the root namespace with LLMPI_NETNS_* in its
#       environment (below), print the counters, tear it down. Use it for your own launch line:
#         tools/netns_link.sh --rate 1gbit -- bash -c 'mpiexec ... ip netns exec "$LLMPI_NETNS_A" prog : ...'
#   tools/netns_link.sh [OPTIONS] up       create the link and leave it (prints the variables)
#   tools/netns_link.sh [OPTIONS] down     remove a link made by `up` (same --name)
#   tools/netns_link.sh [OPTIONS] stats    print the counters of a link made by `up`
#
# OPTIONS
#   --rate R      tbf rate of each direction, tc syntax (1gbit, 10gbit, 500mbit); "none" = no
#                 qdisc (the bare veth). Default 1gbit.
#   --burst B     tbf bucket, tc syntax (default: 1 ms of the rate, at least 64kb)
#   --latency L   tbf queueing limit (default 1ms: a shallow, switch-like buffer. With deep
#                 queues (20ms) the two directions' data and ACKs queue behind each other and
#                 bidirectional collectives vary more; 1ms gives line rate with little spread)
#   --mtu M       veth MTU (default 1500, Ethernet)
#   --name N      base name, [a-z0-9]{1,12}: namespaces and veths are N-a and N-b.
#                 Default: llm<pid> for run/mpi (so concurrent runs never collide), llmpi for
#                 up/down/stats.
#   --stats FILE  (run/mpi) also write the counters (deltas over the command) as JSON to FILE
#   --quiet       no progress lines on stderr
#
# Environment given to COMMAND (run) and printed by `up`:
#   LLMPI_NETNS_A, LLMPI_NETNS_B          namespace names (for `ip netns exec`)
#   LLMPI_NETNS_DEV_A, LLMPI_NETNS_DEV_B  the veth in each (for UCX_NET_DEVICES)
#   LLMPI_NETNS_ADDR_A, LLMPI_NETNS_ADDR_B  10.231.0.1 and 10.231.0.2 (a /30 that exists only
#                                         inside the two namespaces)
#   LLMPI_NETNS_RATE                      the rate
#
# Why those MPI settings: MPICH decides locality from the host name, which both namespaces share,
# so without MPIR_CVAR_NOLOCAL=1 it would treat the ranks as node-local and use shared memory;
# UCX_TLS=tcp,self keeps UCX off its own shared-memory (sm/posix/sysv) and CMA transports; and
# UCX_NET_DEVICES pins its TCP transport to the veth. The counters printed at the end (tx/rx
# bytes of each veth, and the tbf's overlimits) show that the traffic did cross the link.
#
# Nothing outside the two namespaces is touched: the addresses, routes and qdiscs live inside
# them, and the veth pair is moved into them as soon as it is made. On exit — success, failure,
# Ctrl-C or SIGTERM — the processes left in the namespaces (only ones this script started) are
# ended and both namespaces (and with them the veths) are deleted.
set -euo pipefail

PROG=netns_link.sh
die() { echo "$PROG: error: $*" >&2; exit 2; }
say() { [ "$QUIET" = 1 ] || echo "$PROG: $*" >&2; }

RATE=1gbit BURST="" LATENCY=1ms MTU=1500 NAME="" STATS="" QUIET=0 CMD_KIND=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE="${2:?--rate needs a value}"; shift 2 ;;
    --burst) BURST="${2:?--burst needs a value}"; shift 2 ;;
    --latency) LATENCY="${2:?--latency needs a value}"; shift 2 ;;
    --mtu) MTU="${2:?--mtu needs a value}"; shift 2 ;;
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --stats) STATS="${2:?--stats needs a value}"; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    up|down|stats|run|mpi) CMD_KIND="$1"; shift; [ "${1:-}" = "--" ] && shift; break ;;
    --) shift; CMD_KIND=run; break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$CMD_KIND" ] || die "say what to do: up | down | stats | mpi PROGRAM... | -- COMMAND... (see --help)"
if [ "$CMD_KIND" = run ] || [ "$CMD_KIND" = mpi ]; then
  [ $# -gt 0 ] || die "$CMD_KIND: no command given"
else
  [ $# -eq 0 ] || die "$CMD_KIND takes no arguments, got '$*'"
fi

# --- preconditions -----------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (it creates network namespaces and qdiscs); try: sudo $0 ..."
for t in ip tc; do
  command -v "$t" >/dev/null 2>&1 || die "'$t' not found; install iproute2 (apt-get install iproute2)"
done
if [ "$CMD_KIND" = mpi ]; then command -v mpiexec >/dev/null 2>&1 || die "'mpiexec' not found (apt-get install mpich)"; fi
if [ -z "$NAME" ]; then
  case "$CMD_KIND" in run|mpi) NAME="llm$$" ;; *) NAME=llmpi ;; esac
fi
[[ "$NAME" =~ ^[a-z0-9]{1,12}$ ]] || die "--name '$NAME' must be 1-12 characters of [a-z0-9]"
[[ "$MTU" =~ ^[0-9]+$ ]] || die "--mtu '$MTU' must be an integer"

NS_A="$NAME-a" NS_B="$NAME-b" DEV_A="$NAME-a" DEV_B="$NAME-b"
ADDR_A=10.231.0.1 ADDR_B=10.231.0.2 PREFIX=30

# rate in bit/s from tc syntax, for the default burst
rate_bps() {
  local r="${1,,}" n u
  [[ "$r" =~ ^([0-9.]+)([a-z]*)$ ]] || die "--rate '$1' is not a tc rate (e.g. 1gbit, 100mbit)"
  n="${BASH_REMATCH[1]}" u="${BASH_REMATCH[2]}"
  case "$u" in
    bit|"") awk -v n="$n" 'BEGIN{printf "%.0f", n}' ;;
    kbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e3}' ;;
    mbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e6}' ;;
    gbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e9}' ;;
    tbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e12}' ;;
    *) die "--rate '$1': use bit, kbit, mbit, gbit or tbit" ;;
  esac
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

# --- teardown (idempotent; only our namespaces and the processes inside them) --------------
teardown() {
  local ns pid
  for ns in "$NS_A" "$NS_B"; do
    ns_exists "$ns" || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
  done
  for ns in "$NS_A" "$NS_B"; do
    ns_exists "$ns" || continue
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.2; done
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  # a veth that was made but not yet moved (failure in between) is still in the root namespace
  if ip link show "$DEV_A" >/dev/null 2>&1; then ip link del "$DEV_A" 2>/dev/null || true; fi
}

counter() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/$3" 2>/dev/null || echo 0; }
overlimits() {  # tbf "overlimits" = packets the rate limit made wait
  tc -n "$1" -s qdisc show dev "$2" 2>/dev/null | awk '/overlimits/{for(i=1;i<NF;i++) if($(i+1) ~ /^overlimits/){gsub(/[^0-9]/,"",$(i+2)); print $(i+2); exit}}' | grep . || echo 0
}
snapshot() {  # prints: txA rxA txB rxB ovA ovB
  echo "$(counter "$NS_A" "$DEV_A" tx_bytes) $(counter "$NS_A" "$DEV_A" rx_bytes)" \
       "$(counter "$NS_B" "$DEV_B" tx_bytes) $(counter "$NS_B" "$DEV_B" rx_bytes)" \
       "$(overlimits "$NS_A" "$DEV_A") $(overlimits "$NS_B" "$DEV_B")"
}

setup() {
  local burst="$BURST" bps
  ns_exists "$NS_A" && die "namespace $NS_A already exists (run: $0 --name $NAME down)"
  ns_exists "$NS_B" && die "namespace $NS_B already exists (run: $0 --name $NAME down)"
  if [ "$RATE" != none ]; then
    bps=$(rate_bps "$RATE")
    if [ -z "$burst" ]; then  # 1 ms of traffic, at least 64 KiB (a GSO segment), in bytes
      burst=$(awk -v b="$bps" 'BEGIN{x=b/8/1000; if(x<65536)x=65536; printf "%.0f", x}')
    fi
  fi
  ip netns add "$NS_A" || die "ip netns add failed (does this kernel/container allow network namespaces?)"
  ip netns add "$NS_B" || die "ip netns add failed"
  ip link add "$DEV_A" mtu "$MTU" type veth peer name "$DEV_B" mtu "$MTU" || die "cannot create a veth pair"
  ip link set "$DEV_A" netns "$NS_A"
  ip link set "$DEV_B" netns "$NS_B"
  local side ns dev addr
  for side in A B; do
    if [ $side = A ]; then ns=$NS_A dev=$DEV_A addr=$ADDR_A; else ns=$NS_B dev=$DEV_B addr=$ADDR_B; fi
    # IPv4 only, so UCX's TCP transport has exactly one address to pick
    # shellcheck disable=SC2016  # $f is expanded by the inner sh
    ip netns exec "$ns" sh -c 'for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do echo 1 > "$f"; done' 2>/dev/null || true
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$addr/$PREFIX" dev "$dev"
    ip -n "$ns" link set "$dev" up
    if [ "$RATE" != none ]; then
      tc -n "$ns" qdisc add dev "$dev" root tbf rate "$RATE" burst "$burst" latency "$LATENCY" \
        || die "tc qdisc add tbf failed (rate $RATE burst $burst latency $LATENCY)"
    fi
  done
  if command -v ping >/dev/null 2>&1; then
    ip netns exec "$NS_A" ping -c 1 -W 2 "$ADDR_B" >/dev/null 2>&1 || say "warning: ping $ADDR_A -> $ADDR_B failed"
  fi
  say "link up: $NS_A/$DEV_A $ADDR_A <-> $NS_B/$DEV_B $ADDR_B, rate ${RATE}${burst:+ burst ${burst}b} latency $LATENCY mtu $MTU"
}

export_vars() {
  export LLMPI_NETNS_A="$NS_A" LLMPI_NETNS_B="$NS_B" LLMPI_NETNS_DEV_A="$DEV_A" LLMPI_NETNS_DEV_B="$DEV_B" \
         LLMPI_NETNS_ADDR_A="$ADDR_A" LLMPI_NETNS_ADDR_B="$ADDR_B" LLMPI_NETNS_RATE="$RATE"
}

report() {  # $1 = before snapshot, $2 = after, $3 = seconds, $4 = command status
  read -r a0 b0 c0 d0 e0 f0 <<<"$1"
  read -r a1 b1 c1 d1 e1 f1 <<<"$2"
  local txa=$((a1 - a0)) rxa=$((b1 - b0)) txb=$((c1 - c0)) rxb=$((d1 - d0)) ova=$((e1 - e0)) ovb=$((f1 - f0))
  say "link counters over the command ($3 s, exit $4): $DEV_A tx $txa rx $rxa bytes, tbf overlimits $ova;" \
      "$DEV_B tx $txb rx $rxb bytes, tbf overlimits $ovb"
  if [ -n "$STATS" ]; then
    cat >"$STATS" <<EOF
{"rate": "$RATE", "seconds": $3, "exit": $4,
 "a": {"netns": "$NS_A", "dev": "$DEV_A", "addr": "$ADDR_A", "tx_bytes": $txa, "rx_bytes": $rxa, "tbf_overlimits": $ova},
 "b": {"netns": "$NS_B", "dev": "$DEV_B", "addr": "$ADDR_B", "tx_bytes": $txb, "rx_bytes": $rxb, "tbf_overlimits": $ovb}}
EOF
  fi
}

case "$CMD_KIND" in
  down)
    teardown; say "removed $NS_A and $NS_B"; exit 0 ;;
  stats)
    ns_exists "$NS_A" || die "no namespace $NS_A (made by: $0 --name $NAME up)"
    read -r a b c d e f <<<"$(snapshot)"
    echo "$DEV_A tx_bytes $a rx_bytes $b tbf_overlimits $e"
    echo "$DEV_B tx_bytes $c rx_bytes $d tbf_overlimits $f"
    tc -n "$NS_A" -s qdisc show dev "$DEV_A"; tc -n "$NS_B" -s qdisc show dev "$DEV_B"
    exit 0 ;;
  up)
    trap 'teardown' ERR
    setup
    trap - ERR
    export_vars
    for v in A B DEV_A DEV_B ADDR_A ADDR_B RATE; do eval "echo export LLMPI_NETNS_$v=\$LLMPI_NETNS_$v"; done
    say "remove with: $0 --name $NAME down"
    exit 0 ;;
esac

# run / mpi: the link lives exactly as long as this script.
CHILD="" BEFORE="" T0=""
# shellcheck disable=SC2317  # reached through the trap
on_signal() {
  trap '' INT TERM HUP
  say "signal: stopping the command and removing the link"
  if [ -n "$CHILD" ]; then
    kill -TERM "$CHILD" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CHILD" 2>/dev/null || true
  fi
  if [ -n "$BEFORE" ]; then
    report "$BEFORE" "$(snapshot)" "$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.3f", b-a}')" 130
  fi
  exit 130
}
trap teardown EXIT
trap on_signal INT TERM HUP
setup
export_vars
BEFORE=$(snapshot)
T0=$(date +%s.%N)
if [ "$CMD_KIND" = mpi ]; then
  set -- mpiexec -genv UCX_TLS tcp,self -genv MPIR_CVAR_NOLOCAL 1 \
    -n 1 -env UCX_NET_DEVICES "$DEV_A" ip netns exec "$NS_A" "$@" : \
    -n 1 -env UCX_NET_DEVICES "$DEV_B" ip netns exec "$NS_B" "$@"
  say "$*"
fi
# in the background, so that a signal to this script is handled at once (wait returns)
"$@" &
CHILD=$!
set +e
wait "$CHILD"
RC=$?
set -e
CHILD=""
T1=$(date +%s.%N)
report "$BEFORE" "$(snapshot)" "$(awk -v a="$T0" -v b="$T1" 'BEGIN{printf "%.3f", b-a}')" "$RC"
exit "$RC"
