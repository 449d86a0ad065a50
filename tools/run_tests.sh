#!/usr/bin/env bash
# The test suite. Usage: tools/run_tests.sh [cpu | cuda-sim | all]   (default all)
#   cpu       (make test) groups 1, 2 and 4 but the simulated-card scripts
#   cuda-sim  (make test-cuda) group 3 and the simulated-card scripts of group 4 (tests/cli/sim_*.sh)
# The groups:
#   1. unit tests:   llmpi-tests --gtest_filter=-Mpi*, over TEST_PROCS processes at once
#   2. MPI tests, each in its own `mpiexec` with its own time limit, so a deadlock fails that test
#      instead of hanging the suite: Mpi* under -n 2, MpiN4* under -n 4, MpiN6* under -n 6
#   3. CUDA kernels run on the CPU (tools/cuda_cpu_sim): the tensor-core fused-attention kernels
#      (bf16, tf32; build/sim-flash_mma), CUDA ops with their launchers (build/sim-cuda_ops) and
#      the CUDA unit tests on that simulated backend, but the slowest (build/sim-cuda_tests); its
#      NCCL over MPI at 2 and 4 ranks (build/sim-nccl_tests, and sim-cuda_tests' NcclRanks.*)
#   4. command-line checks: tests/cli/*.sh (exit codes and messages of the real programs)
# Logs go to $BUILD/test-logs/. A Google Test program's tests are counted one by one from its own
# per-test lines, a crash or a time-out named with the test it happened in (tools/gtest_groups.bash;
# checked by tests/cli/runner.sh); every other program or script counts as one. The last lines
# name every failure and read "llmpi tests: N passed, N failed, N skipped".
set -u
BUILD=${BUILD:-build}
PART=${1:-all}
case $PART in
  cpu | cuda-sim | all) ;;
  *) echo "usage: tools/run_tests.sh [cpu | cuda-sim | all]" >&2; exit 2 ;;
esac
# Every time limit below is multiplied by TIME_SCALE: 1 by default, 4 for a sanitizer build (make
# test SAN=1 passes SAN=1), where the simulated-CUDA groups run 2-10x slower than without
# (measured on 2 cores: sim-flash_mma 142 s against 15-60 s, sim-cuda_tests 524 s against 154 s).
export TIME_SCALE=${TIME_SCALE:-$([ "${SAN:-0}" = 1 ] && echo 4 || echo 1)}  # tests/cli/*.sh scale theirs too
MPI_TIMEOUT=${MPI_TIMEOUT:-$((180 * TIME_SCALE))}   # seconds per MPI test
# The serial groups (unit tests, the CUDA unit tests on the simulated backend) run their tests over
# TEST_PROCS processes at once (gtest_group_split), one per core by default, at most 8.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # (nproc alone obeys OMP_NUM_THREADS)
TEST_PROCS=${TEST_PROCS:-$((CORES > 8 ? 8 : CORES))}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# For a SAN=1 build (ignored by a normal one); the programs run under mpiexec inherit these.
# ASan/UBSan reports fail the test (UBSan halts on the first error); leaks are reported except
# those inside third-party libraries (MPICH, UCX, HDF5, OpenBLAS, ...: tools/sanitizer/lsan.supp).
# allocator_may_return_null=1: an allocation too large to satisfy fails the way it does without
# ASan (operator new throws std::bad_alloc, which llmpi reports as a clean error; tested by
# cli/run_dir), instead of ASan aborting the process.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:allocator_may_return_null=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$0")" && pwd)/sanitizer/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# The simulated-CUDA programs (build/sim-*, and tests/cli/sim_*.sh, which run them) turn every CUDA
# thread into a fiber (tools/cuda_cpu_sim/fiber.cpp), and detect_stack_use_after_return makes and
# frees a fake stack for each one: 25-130x slower (one test 5 s against 39 ms, the GPT-2 MLP case
# 455 s against 18 s). They run with that one check off and every other on.
SIM_ASAN_OPTIONS=${ASAN_OPTIONS//detect_stack_use_after_return=1/detect_stack_use_after_return=0}
LOGS=$BUILD/test-logs
mkdir -p "$LOGS"
BIN=$BUILD/llmpi-tests
pass=0; fail=0; skip=0; failed_names=()
source "$(dirname "$0")/gtest_groups.bash"

started=$SECONDS  # set before each run; record() and gtest_report print the seconds since, and reset it
record() {  # name status log
  local took=$((SECONDS - started))
  if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "  ok    $1 (${took} s)"
  else fail=$((fail + 1)); failed_names+=("$1"); echo "  FAIL  $1 (exit $2 after ${took} s; log $3)"; tail -n 30 "$3" | sed 's/^/        | /'; fi
  started=$SECONDS
}

# gtest_report LABEL LOG: adds a gtest_group's counts (tools/gtest_groups.bash) to the totals and
# names every failure, with the first lines of its output.
gtest_report() {
  local label=$1 log=$2 f name
  pass=$((pass + GT_PASS)); fail=$((fail + GT_FAIL)); skip=$((skip + GT_SKIP))
  for f in "${GT_FAILED[@]}"; do
    failed_names+=("$label: $f"); echo "  FAIL  $label: $f (log $log)"
    name=${f%%:*}
    gtest_test_output "$log" "$name" | grep -v '^\[' | head -n 15 | sed 's/^/        | /'
  done
  echo "  $label: $GT_PASS passed, $GT_FAIL failed, $GT_SKIP skipped in $((SECONDS - started)) s (log $log)"
  started=$SECONDS
}

if [ "$PART" != cuda-sim ]; then
echo "== unit tests ($TEST_PROCS processes)"
# The peak-RSS comparisons (*PeakRss*) run each in a process of its own below: a process's peak
# and resident set include what earlier tests left mapped.
log=$LOGS/unit.log
started=$SECONDS
gtest_group_split "$TEST_PROCS" $((1200 * TIME_SCALE)) "$log" '-Mpi*:*PeakRss*' "$BIN"
gtest_report unit "$log"
# the commonest reasons for a skip (gtest prints the reason on the line after "...: Skipped")
grep -A1 ': Skipped$' "$log" | grep -vE ': Skipped$|^--$' | sort | uniq -c | sort -rn | head -5 |
  sed -E 's/^ *([0-9]+) /        skipped \1 x: /'

for t in $("$BIN" --gtest_filter='*PeakRss*:-Mpi*' --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}'); do
  log=$LOGS/$t.log; started=$SECONDS
  gtest_group $((300 * TIME_SCALE)) "$log" "$t" "$BIN"
  gtest_report "$t (a process of its own)" "$log"
done

echo "== MPI tests (each under its own time limit of ${MPI_TIMEOUT}s)"
tests=$("$BIN" --gtest_filter='Mpi*' --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
for t in $tests; do
  np=2; case "$t" in MpiN4*) np=4 ;; MpiN6*) np=6 ;; esac
  log=$LOGS/$t.log; started=$SECONDS
  timeout --kill-after=10 "$MPI_TIMEOUT" mpiexec -n $np "$BIN" --gtest_filter="$t" >"$log" 2>&1
  record "$t (-n $np)" $? "$log"
done

fi

if [ "$PART" != cpu ]; then
echo "== CUDA kernels run on the CPU (tools/cuda_cpu_sim)"
log=$LOGS/sim-flash_mma.log
ASAN_OPTIONS=$SIM_ASAN_OPTIONS timeout --kill-after=10 $((600 * TIME_SCALE)) "$BUILD/sim-flash_mma" >"$log" 2>&1
record "sim-flash_mma (the bf16 and tf32 fused-attention kernels against the CPU op)" $? "$log"
log=$LOGS/sim-cuda_ops.log
ASAN_OPTIONS=$SIM_ASAN_OPTIONS timeout --kill-after=10 $((600 * TIME_SCALE)) "$BUILD/sim-cuda_ops" >"$log" 2>&1
record "sim-cuda_ops (CUDA ops, kernels and launchers, against the CPU ops)" $? "$log"
# The CUDA unit tests on the simulated backend: all of them but 20 left out for their time, 10 s to
# 7 min each there (tools/cuda_cpu_sim/README.md: they pass given it): the AdamW training curves,
# the flash bf16 cases at T = 1023/1024, the GPT-2 124M steps, the softmax over 2^31 logits
# (8.6 GB), AdamW over 124M parameters, the bias gradient at 65,536 rows, and cuDNN's fallback
# cases (41 s; without cuDNN, as here, both of its sides run the same kernels); and by design
# CudaBackend.AvailabilityMatchesMachine (it expects no GPU on a machine without /dev/nvidiactl).
# The simulated cuBLAS shares the cores with the other processes of the group. (NcclSync.* and
# NcclRanks.* run here at one rank, NcclRanks.* again at 2 and 4 below.)
SIM_TESTS='-CudaBackend.AvailabilityMatchesMachine'
SIM_TESTS+=':*AdamWTrainingFollowsCpuLossCurve/*:*CudaFlashBf16.MatchesCpuEmulation/*T102*:CudaRealShape.Gpt2Small*'
SIM_TESTS+=':CudaRealShape.SoftmaxXentBeyond2To31Logits:CudaRealShape.AdamWOverGpt2SmallParameterCount'
SIM_TESTS+=':CudaRealShapeEpilogues.BiasGradientAt65536Rows:CudnnAttentionFallback.*'
SIM_EXPECTED=211
log=$LOGS/sim-cuda_tests.log
started=$SECONDS
OMP_NUM_THREADS=$((CORES / TEST_PROCS > 1 ? CORES / TEST_PROCS : 1)) ASAN_OPTIONS=$SIM_ASAN_OPTIONS \
  gtest_group_split "$TEST_PROCS" $((900 * TIME_SCALE)) "$log" "$SIM_TESTS" "$BUILD/sim-cuda_tests"
n_sim=$((GT_PASS + GT_FAIL + GT_SKIP))
if [ "$n_sim" -lt $SIM_EXPECTED ]; then
  GT_FAIL=$((GT_FAIL + 1)); GT_FAILED+=("the filter matched $n_sim tests, not the $SIM_EXPECTED expected")
fi
gtest_report "sim-cuda_tests (CUDA unit tests on the simulated backend)" "$log"
# NCCL on the simulated cards, over MPI (tools/cuda_cpu_sim/README.md, "NCCL"): the stand-in's own
# calls, then NcclSync and GradSync nccl against MPI's averages, each run under its time limit;
# and ranks calling different collectives must stop the job, with every rank's call printed.
for np in 2 4; do
  log=$LOGS/sim-nccl_tests-n$np.log
  ASAN_OPTIONS=$SIM_ASAN_OPTIONS timeout --kill-after=10 "$MPI_TIMEOUT" mpiexec -n $np "$BUILD/sim-nccl_tests" >"$log" 2>&1
  record "sim-nccl_tests (-n $np: the NCCL stand-in's calls, streams and communicators)" $? "$log"
  log=$LOGS/sim-cuda_tests-nccl-n$np.log
  ASAN_OPTIONS=$SIM_ASAN_OPTIONS timeout --kill-after=10 "$MPI_TIMEOUT" mpiexec -n $np "$BUILD/sim-cuda_tests" --gtest_filter='NcclRanks.*' >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ] && [ "$(grep -c '^\[       OK \]' "$log")" != 4 ]; then echo "expected 4 NcclRanks tests to pass" >>"$log"; rc=1; fi
  record "sim-cuda_tests NcclRanks.* (-n $np: NcclSync and GradSync nccl across ranks)" $rc "$log"
done
log=$LOGS/sim-nccl_tests-mismatch.log
ASAN_OPTIONS=$SIM_ASAN_OPTIONS timeout --kill-after=10 "$MPI_TIMEOUT" mpiexec -n 2 "$BUILD/sim-nccl_tests" \
  --gtest_also_run_disabled_tests --gtest_filter='NcclStandInMismatch.*' >"$log" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && grep -q 'make different collective calls' "$log" && grep -q 'count 9' "$log" &&
  grep -q 'count 8' "$log"
record "sim-nccl_tests: ranks calling different collectives stop the job, both calls printed" $? "$log"

fi

echo "== command-line checks"
for s in tests/cli/*.sh; do
  [ -e "$s" ] || continue
  name=$(basename "$s" .sh); log=$LOGS/cli-$name.log; started=$SECONDS
  sim=no asan=$ASAN_OPTIONS
  case $name in sim_*) sim=yes asan=$SIM_ASAN_OPTIONS ;; esac  # (the simulated card's scripts: cuda-sim)
  { [ "$PART" = cpu ] && [ $sim = yes ]; } || { [ "$PART" = cuda-sim ] && [ $sim = no ]; } && continue
  BUILD=$BUILD ASAN_OPTIONS=$asan timeout --kill-after=10 $((300 * TIME_SCALE)) bash "$s" >"$log" 2>&1
  record "cli/$name" $? "$log"
done

echo
[ $fail = 0 ] || printf 'failed: %s\n' "${failed_names[@]}"
echo "llmpi tests: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
