#!/usr/bin/env bash
# The test runner counts what Google Test ran, one test at a time (tools/gtest_groups.bash, used
# by tools/run_tests.sh): planted tests (tests/test_runner_plants.cpp) that pass, fail, skip,
# crash the process and hang are each counted and named; the tests after a crash still run; a
# hang is named with the test it happened in. A few seconds.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/gtest_groups.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

gtest_group $((60 * TIME_SCALE)) "$tmp/planted.log" 'RunnerPlanted.*' "$B/llmpi-tests" --gtest_also_run_disabled_tests
rc=$?
failed=$(printf '%s\n' "${GT_FAILED[@]}")
check "a failure and a crash make the group fail" "[ $rc != 0 ]"
check "counted: 2 passed (one after the crash), 2 failed, 1 skipped" \
  "[ $GT_PASS = 2 ] && [ $GT_FAIL = 2 ] && [ $GT_SKIP = 1 ]" || echo "  got $GT_PASS passed, $GT_FAIL failed, $GT_SKIP skipped"
check "the failed test is named" "grep -qx 'RunnerPlanted.DISABLED_Fails' <<<\"\$failed\""
check "the crash is named with its test and exit code" \
  "grep -qx 'RunnerPlanted.DISABLED_Crashes: crashed (exit 134)' <<<\"\$failed\"" || echo "$failed"
check "the skipped test is named" "[ \"\${GT_SKIPPED[*]}\" = RunnerPlanted.DISABLED_Skips ]"
check "the test after the crash ran in a new process" \
  "grep -q '^\[       OK \] RunnerPlanted.DISABLED_PassesAfterTheCrash' '$tmp/planted.log'"

# The same tests dealt over two processes at once (gtest_group_split): the same counts and names.
gtest_group_split 2 $((60 * TIME_SCALE)) "$tmp/split.log" 'RunnerPlanted.*' "$B/llmpi-tests" --gtest_also_run_disabled_tests
rc=$?
failed=$(printf '%s\n' "${GT_FAILED[@]}" | sort)
check "split over 2 processes: the group fails, 2 passed, 2 failed, 1 skipped" \
  "[ $rc != 0 ] && [ $GT_PASS = 2 ] && [ $GT_FAIL = 2 ] && [ $GT_SKIP = 1 ]" || echo "  got $GT_PASS passed, $GT_FAIL failed, $GT_SKIP skipped"
check "... the failure and the crash named" \
  "[ \"\$failed\" = \"\$(printf '%s\\n' 'RunnerPlanted.DISABLED_Crashes: crashed (exit 134)' RunnerPlanted.DISABLED_Fails)\" ]" || echo "$failed"
check "... both parts' output in the one log" \
  "[ \$(grep -c '^\[ RUN      \]' '$tmp/split.log') = 5 ]"

gtest_group 3 "$tmp/hang.log" 'RunnerPlantedHang.*' "$B/llmpi-tests" --gtest_also_run_disabled_tests
rc=$?
check "a hang fails the group" "[ $rc != 0 ] && [ $GT_FAIL = 1 ] && [ $GT_PASS = 0 ]"
check "the hang is named with its test" \
  "[[ \"\${GT_FAILED[0]}\" == 'RunnerPlantedHang.DISABLED_Hangs: timed out'* ]]" || echo "${GT_FAILED[@]}"

gtest_group $((60 * TIME_SCALE)) "$tmp/pass.log" 'RunnerPlanted.*Passes*' "$B/llmpi-tests" --gtest_also_run_disabled_tests
check "a passing group: exit 0, 2 passed, nothing failed" "[ $? = 0 ] && [ $GT_PASS = 2 ] && [ $GT_FAIL = 0 ]"
exit $status
