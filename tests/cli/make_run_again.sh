#!/usr/bin/env bash
# `make run` can be typed again (tools/demo_run_aside.sh, called before it trains): the demo run
# already there is kept aside in DIR.previous (replacing the one kept before), so the new run
# starts in an empty DIR; a run still training there (its LOCK held) is never moved, and the
# second `make run` stops with one line naming the holder. A second or two; nothing is trained.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'kill $holder 2>/dev/null; rm -rf "$tmp"' EXIT
holder=
aside=tools/demo_run_aside.sh
d=$tmp/runs/demo

check "nothing there: nothing to move, exit 0" "$aside $d >/dev/null && [ ! -e $d ] && [ ! -e $d.previous ]"
mkdir -p "$d" && echo first >"$d/marker"
out=$($aside "$d"); rc=$?
check "a finished run is moved aside" "[ $rc = 0 ] && [ ! -e $d ] && [ \"\$(cat $d.previous/marker)\" = first ]"
check "... and the move is said" "grep -q 'kept in $d.previous' <<<\"\$out\""
mkdir -p "$d" && echo second >"$d/marker" && printf 'host h\npid 1\n' >"$d/LOCK"
check "the next one replaces the one kept before (a stale LOCK file does not stop it)" \
  "$aside $d >/dev/null && [ \"\$(cat $d.previous/marker)\" = second ] && [ ! -e $d ]"
mkdir -p "$d" && echo third >"$d/marker" && printf 'host h\npid 4242\nstarted now\n' >"$d/LOCK"
flock "$d/LOCK" sleep 60 &
holder=$!
for _ in $(seq 50); do flock -n "$d/LOCK" true || break; sleep 0.1; done
out=$($aside "$d" 2>&1); rc=$?
check "a run still training is refused, exit 1" "[ $rc = 1 ]"
check "... with one line naming the holder" "[ \$(wc -l <<<\"\$out\") = 1 ] && grep -q 'in use by a demo run still training (host h pid 4242' <<<\"\$out\"" ||
  echo "$out"
check "... and nothing is moved" "[ \"\$(cat $d/marker)\" = third ] && [ \"\$(cat $d.previous/marker)\" = second ]"
exit $status
