# Counting a Google Test program's results from its own per-test lines (sourced by
# tools/run_tests.sh and tests/cli/runner.sh).
#
# gtest_group LIMIT LOG FILTER CMD [ARGS...]
#   Runs `CMD ARGS --gtest_filter=FILTER` under `timeout LIMIT`, its output in LOG, and counts
#   every test from the lines gtest prints for it: "[       OK ] Name (N ms)", "[  FAILED  ]
#   Name (N ms)", "[  SKIPPED ] Name (N ms)". A test that printed "[ RUN      ] Name" and no
#   result line is the one the program died in: it is counted as failed and named ("crashed in"
#   with the exit code, or "timed out in" when LIMIT ran out). After a crash, the tests not yet
#   run are run again in a new process (FILTER less every test seen), up to 3 times; after a
#   time-out they are not (the limit is for the whole group), and the tests left are named by
#   count. A program that ran every test it started and still exits non-zero (a leak reported
#   at exit, a failure on another MPI rank) counts one failure for that, named with its code.
# Sets:
#   GT_PASS GT_FAIL GT_SKIP    counts
#   GT_FAILED                  array: one line per failure ("Suite.Name", "Suite.Name: crashed
#                              (exit 134)", "after its tests: exit 1", ...)
#   GT_SKIPPED                 array: the skipped tests' names
# Needs: bash >= 4, timeout, awk.

# The result lines of one log: "OK name", "FAILED name", "SKIPPED name", "RUN name" in order.
gtest_result_lines() {
  awk '
    /^\[ RUN      \] / { print "RUN " $4; next }
    /^\[       OK \] .* \([0-9]+ ms\)$/ { print "OK " $4; next }
    /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ { print "SKIPPED " $4; next }
    /^\[  FAILED  \] .* \([0-9]+ ms\)$/ { n = $4; sub(/,$/, "", n); print "FAILED " n; next }
  ' "$1"
}

gtest_group() {
  local limit=$1 log=$2 filter=$3
  shift 3
  GT_PASS=0 GT_FAIL=0 GT_SKIP=0 GT_FAILED=() GT_SKIPPED=()
  : >"$log"
  local -A seen=()
  local attempt rc part f ex status name in_flight
  for attempt in 0 1 2 3; do
    f=$filter
    if ((${#seen[@]})); then  # the tests already run, left out
      ex=$(IFS=:; echo "${!seen[*]}")
      if [[ $f == *-* ]]; then f="$f:$ex"; else f="${f:-*}-$ex"; fi
    fi
    part=$log.$attempt
    # (in a subshell whose stderr is dropped: the shell's own "Aborted" line for a crash)
    (timeout --kill-after=10 "$limit" "$@" --gtest_filter="$f" >"$part" 2>&1; exit $?) 2>/dev/null
    rc=$?
    cat "$part" >>"$log"
    in_flight=
    while read -r status name; do
      case $status in
        RUN) in_flight=$name; seen[$name]=1 ;;
        OK) GT_PASS=$((GT_PASS + 1)); in_flight= ;;
        SKIPPED) GT_SKIP=$((GT_SKIP + 1)); GT_SKIPPED+=("$name"); in_flight= ;;
        FAILED) GT_FAIL=$((GT_FAIL + 1)); GT_FAILED+=("$name"); in_flight= ;;
      esac
    done < <(gtest_result_lines "$part")
    rm -f "$part"
    if [ $rc = 0 ]; then return $((GT_FAIL > 0)); fi
    if [ -n "$in_flight" ]; then
      GT_FAIL=$((GT_FAIL + 1))
      if [ $rc = 124 ] || [ $rc = 137 ]; then
        GT_FAILED+=("$in_flight: timed out (the group's limit of $limit s); the tests after it did not run")
        return 1
      fi
      GT_FAILED+=("$in_flight: crashed (exit $rc)")
      continue  # the rest, in a new process
    fi
    if [ $rc = 124 ] || [ $rc = 137 ]; then
      GT_FAIL=$((GT_FAIL + 1)); GT_FAILED+=("timed out (limit $limit s) outside any test")
    elif [ "$GT_FAIL" = 0 ]; then
      GT_FAIL=$((GT_FAIL + 1)); GT_FAILED+=("exit $rc after its tests passed (see the end of $log)")
    fi
    return 1
  done
  GT_FAIL=$((GT_FAIL + 1)); GT_FAILED+=("stopped after 4 crashes; the tests after the last did not run")
  return 1
}

# The output of test NAME in LOG (from its RUN line to its result line), at most 25 lines.
gtest_test_output() {
  awk -v name="$2" '
    $0 == "[ RUN      ] " name { on = 1; n = 0 }
    on { if (n++ < 25) print }
    on && /^\[  (FAILED |     OK|SKIPPED) \]/ && index($0, name) { on = 0 }
  ' "$1"
}

# gtest_group_split N LIMIT LOG FILTER CMD [ARGS...]
#   gtest_group over N processes at once: the tests FILTER selects (CMD's own --gtest_list_tests),
#   dealt in turn into N lists, each list a gtest_group of its own (log LOG.partI) under LIMIT;
#   the parts' logs are then appended to LOG in order and their counts and names summed into
#   GT_*, as one gtest_group sets them. For programs whose tests share nothing but the machine
#   (each test makes its own temporary files). N = 1 is gtest_group itself.
gtest_group_split() {
  local n=$1 limit=$2 log=$3 filter=$4
  shift 4
  if [ "$n" -le 1 ]; then gtest_group "$limit" "$log" "$filter" "$@"; return; fi
  local names=() i j list name p f s
  mapfile -t names < <("$@" --gtest_filter="$filter" --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
  [ "${#names[@]}" -lt "$n" ] && n=${#names[@]}
  if [ "$n" -le 1 ]; then gtest_group "$limit" "$log" "$filter" "$@"; return; fi
  for ((i = 0; i < n; i++)); do
    list=
    for ((j = i; j < ${#names[@]}; j += n)); do list+="${names[j]}:"; done
    # (each part writes its counts, then one line per failure and per skip, for the sum below)
    (
      gtest_group "$limit" "$log.part$i" "${list%:}" "$@"
      echo "$GT_PASS $GT_FAIL $GT_SKIP"
      for name in "${GT_FAILED[@]}"; do echo "F $name"; done
      for name in "${GT_SKIPPED[@]}"; do echo "S $name"; done
    ) >"$log.counts$i" &
  done
  wait
  GT_PASS=0 GT_FAIL=0 GT_SKIP=0 GT_FAILED=() GT_SKIPPED=()
  : >"$log"
  for ((i = 0; i < n; i++)); do
    cat "$log.part$i" >>"$log" 2>/dev/null
    {
      read -r p f s || { p=0 f=1 s=0; GT_FAILED+=("part $((i + 1)) of $n reported nothing (see $log)"); }
      GT_PASS=$((GT_PASS + p)) GT_FAIL=$((GT_FAIL + f)) GT_SKIP=$((GT_SKIP + s))
      while IFS= read -r name; do
        case $name in
          "F "*) GT_FAILED+=("${name#F }") ;;
          "S "*) GT_SKIPPED+=("${name#S }") ;;
        esac
      done
    } <"$log.counts$i"
    rm -f "$log.part$i" "$log.counts$i"
  done
  return $((GT_FAIL > 0))
}
