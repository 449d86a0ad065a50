#!/usr/bin/env bash
# The numerical tests again on the kernels other CPUs get (make test-kernels, which CI runs after
# make test; --quick runs the first QUICK paths only). OpenBLAS (Debian's DYNAMIC_ARCH build) picks its
# kernels by the CPU it recognises, and oneDNN by the instructions it finds; OPENBLAS_CORETYPE and
# ONEDNN_MAX_CPU_ISA make this CPU run what another would. Each path below stands for CPUs users
# have:
#   Prescott   + AVX2              a CPU this OpenBLAS does not know (Xeon Sapphire Rapids and later
#                                  under 0.3.21): its generic SSE3 kernels; oneDNN without bf16
#   Haswell    + AVX2              AVX2 Intel (Haswell to Comet Lake) and AVX2 CPUs it maps there
#   Zen        + AVX2              AMD Zen 1-3
#   SkylakeX   + AVX512_CORE       AVX-512 Xeons (Skylake-SP to Ice Lake), oneDNN's fp32 paths there
#   Cooperlake + AVX512_CORE_BF16  AVX-512 with bf16 (Cooper Lake, Zen 4 and 5): oneDNN's bf16 GEMMs
#   SkylakeX   + AVX512_CORE_AMX   Sapphire Rapids' oneDNN (AMX tiles) where the CPU has AMX; the
#                                  AVX-512 bf16 kernels where it does not
# A path whose instructions this CPU lacks is skipped and named (its kernels would stop the program
# on an illegal instruction). Under each path: the unit tests, and the MPI tests that
# compare layouts against one rank and shards against the whole model. Every comparison in them is exact by construction or bounded by an error estimate
# written beside it, so all must pass on every path.
#
# Usage: tools/kernel_paths.sh [--quick]    BUILD=dir (default build)
# Prints a group per path and "kernel paths: N passed, N failed, N skipped"; exit 1 on a failure.
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/llmpi-tests
LOGS=$BUILD/test-logs/kernel-paths
mkdir -p "$LOGS"
source "$(dirname "$0")/gtest_groups.bash"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TIME_SCALE=${TIME_SCALE:-1}
MPI_TIMEOUT=${MPI_TIMEOUT:-$((180 * TIME_SCALE))}
# the unit tests' processes at once: one per core, at most 8 (nproc without the OMP_* limits)
TEST_PROCS=${TEST_PROCS:-$(n=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc); echo $((n > 8 ? 8 : n)))}

PATHS=(
  "Prescott AVX2"
  "SkylakeX AVX512_CORE"
  "Haswell AVX2"
  "Zen AVX2"
  "Cooperlake AVX512_CORE_BF16"
  "SkylakeX AVX512_CORE_AMX"
)
QUICK=2  # --quick: the first two (the generic kernels and the AVX-512 ones without bf16)
n_paths=${#PATHS[@]}
[ "${1:-}" = --quick ] && n_paths=$QUICK

# Every serial unit test (those that compute nothing a kernel could change take seconds), but the
# peak-RSS comparisons, which run in a process of their own in make test, and the runner's plants.
UNIT_FILTER='-Mpi*:*PeakRss*:Runner*'
# Layouts against one rank, shards against the whole model, bf16 against fp32.
MPI_TESTS=(
  "2 MpiTensorParallel.*"
  "4 MpiN4TensorParallel.ShardsEqualTheWholeModel"
  "2 MpiFamilies.*TwoRanksEqualOneRank"
  "2 MpiAccumulation.*EverySyncMethodEqualsOneBatch"
  "2 MpiPrecision.*"
  "2 MpiPipeline.Gpt2TwoStagesEverySchedule"
  "2 MpiLmHead.*"
  "2 MpiSync.AllGradientMethodsAgreeWithEachOtherAndOneRank"
)

# has FLAG...: every flag is in /proc/cpuinfo's first "flags" line.
has() {
  local flags f
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done
}
runs_here() {  # OPENBLAS_CORETYPE: the instructions its kernels use
  case $1 in
    Prescott) has sse3 || has pni ;;
    Haswell | Zen) has avx2 fma ;;
    SkylakeX) has avx512f avx512bw avx512dq avx512vl ;;
    Cooperlake) has avx512f avx512bw avx512dq avx512vl avx512_bf16 ;;
    *) return 1 ;;
  esac
}

pass=0 fail=0 skip=0 failed=()
for ((i = 0; i < n_paths; i++)); do
  read -r core isa <<<"${PATHS[$i]}"
  name="OPENBLAS_CORETYPE=$core ONEDNN_MAX_CPU_ISA=$isa"
  if ! runs_here "$core"; then
    echo "== $name: skipped, this CPU lacks the instructions of OpenBLAS's $core kernels"
    continue
  fi
  echo "== $name"
  started=$SECONDS
  log=$LOGS/$core-$isa-unit.log
  OPENBLAS_CORETYPE=$core ONEDNN_MAX_CPU_ISA=$isa gtest_group_split "$TEST_PROCS" $((600 * TIME_SCALE)) "$log" "$UNIT_FILTER" "$BIN"
  pass=$((pass + GT_PASS)) fail=$((fail + GT_FAIL)) skip=$((skip + GT_SKIP))
  for f in "${GT_FAILED[@]}"; do failed+=("$name: $f"); echo "  FAIL  $f (log $log)"; done
  echo "  unit: $GT_PASS passed, $GT_FAIL failed, $GT_SKIP skipped in $((SECONDS - started)) s"
  for entry in "${MPI_TESTS[@]}"; do
    read -r np filter <<<"$entry"
    started=$SECONDS
    log=$LOGS/$core-$isa-${filter//[*.]/_}.log
    OPENBLAS_CORETYPE=$core ONEDNN_MAX_CPU_ISA=$isa gtest_group "$MPI_TIMEOUT" "$log" "$filter" mpiexec -n "$np" "$BIN"
    pass=$((pass + GT_PASS)) fail=$((fail + GT_FAIL)) skip=$((skip + GT_SKIP))
    for f in "${GT_FAILED[@]}"; do failed+=("$name: $f (-n $np)"); echo "  FAIL  $f (-n $np, log $log)"; done
    echo "  $filter (-n $np): $GT_PASS passed, $GT_FAIL failed in $((SECONDS - started)) s"
  done
done
[ $fail = 0 ] || printf 'failed: %s\n' "${failed[@]}"
echo "kernel paths: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
