#!/usr/bin/env bash
# One command that verifies the CUDA backend on a GPU machine, within a fixed budget.
#
#   tools/gpu_verify.sh OUTDIR
#
# Run it from the project root. It uses the llmpi binaries on PATH if there are any (a GPU machine
# without MPICH/HDF5: `source .device/env.sh` first, after packing them here with
#   make CUDA=1 -j2 && tools/gpu_verify.sh --pack
# which calls ../shared/device/pack.sh, or $PACK_SH, with every binary this script needs), else
# those in ${BUILD:-build}/.
#
# Steps, each under its own time limit so one failure cannot eat the budget (seconds, override
# with LIMIT_<STEP>=N):
#   gpu            nvidia-smi
#   cuda_tests     llmpi-tests --gtest_filter='Cuda*:NcclSync*' (ops, model, real shapes)
#   memcheck       compute-sanitizer memcheck on CudaOps.* and the small fused-attention cases
#                  (racecheck, initcheck: likewise)
#   train_cpu/gpu  llmpi-train 50 steps on a tiny GPT-2 on runtime.device=cpu, then =cuda; the
#                  losses are compared step by step (relative 1e-3)
#   mpi_staging    2 ranks sharing the GPU through parallel.sync=allreduce (host staging)
#   mpi_staging_zero  the same with parallel.zero=1 (ZeRO-1); losses vs mpi_staging's (1e-5)
#   nccl_world1    parallel.sync=nccl at world size 1
#   bench_bB       bench-gpu_gpt2 at batch 8, 16, 32, 64 (fp32; T = 1024; fused attention, the
#                  default on CUDA), and bench_b8_full: batch 8 with --attention full
# Writes OUTDIR/gpu_verify.log (everything) and OUTDIR/gpu_verify.json (one record per step:
# name, rc, seconds, and the figures it found). Exit status: the number of failed steps.
set -uo pipefail

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then usage; exit 0; fi

BUILD=${BUILD:-build}
BINS="llmpi-tests llmpi-train llmpi-prep llmpi-demo-corpus bench-gpu_gpt2"
if [ "${1:-}" = "--pack" ]; then
  PACK_SH=${PACK_SH:-../shared/device/pack.sh}
  [ -x "$PACK_SH" ] || { echo "gpu_verify: no pack script at $PACK_SH (set PACK_SH=)" >&2; exit 2; }
  paths=(); for b in $BINS; do
    f=$BUILD/$b; [ "$b" = bench-gpu_gpt2 ] || [ -x "$f" ] || { echo "gpu_verify: $f missing: run make CUDA=1 first" >&2; exit 2; }
    [ -x "$f" ] && paths+=("$f")
  done
  exec "$PACK_SH" "${paths[@]}"
fi
[ $# -eq 1 ] || { usage >&2; exit 2; }
OUT=$1
mkdir -p "$OUT" || exit 2
LOG=$OUT/gpu_verify.log
JSON=$OUT/gpu_verify.json
: >"$LOG"
echo "[" >"$JSON"
first_record=1
failed=0

bin() {  # the path of a program: on PATH (packed) or in $BUILD
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"; else echo "$BUILD/$1"; fi
}
TESTS=$(bin llmpi-tests); TRAIN=$(bin llmpi-train); PREP=$(bin llmpi-prep)
CORPUS=$(bin llmpi-demo-corpus); BENCH=$(bin bench-gpu_gpt2)
MPIEXEC=$(command -v mpiexec || command -v mpiexec.hydra || echo mpiexec)

# record NAME RC SECONDS EXTRA_JSON
record() {
  [ $first_record = 1 ] || echo "," >>"$JSON"
  first_record=0
  printf '  {"step": "%s", "rc": %d, "seconds": %s%s}' "$1" "$2" "$3" "${4:+, $4}" >>"$JSON"
  if [ "$2" = 0 ]; then echo "== $1: ok (${3}s)" | tee -a "$LOG"
  else failed=$((failed + 1)); echo "== $1: FAILED rc=$2 (${3}s)" | tee -a "$LOG"; fi
}

# step NAME DEFAULT_LIMIT CMD... : runs CMD under its limit, output to the log and NAME.out
step() {
  local name=$1 limit=$2; shift 2
  local var="LIMIT_${name^^}"; limit=${!var:-$limit}
  echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
  local t0; t0=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.out" 2>&1
  local rc=$?
  local dt; dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  tail -n 40 "$OUT/$name.out" | sed 's/^/   | /' >>"$LOG"
  STEP_RC=$rc; STEP_SECONDS=$dt
}

git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "gpu_verify: commit $git_rev, $(date -u +%Y-%m-%dT%H:%M:%SZ), out $OUT" | tee -a "$LOG"

step gpu 30 nvidia-smi
card=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
record gpu $STEP_RC $STEP_SECONDS "\"card\": \"${card}\", \"commit\": \"$git_rev\""

step cuda_tests 420 "$TESTS" --gtest_filter='Cuda*:NcclSync*' --gtest_brief=1
passed=$(grep -oP '^\[  PASSED  \] \K[0-9]+' "$OUT/cuda_tests.out" | tail -1)
nfail=$(grep -oP '^\[  FAILED  \] \K[0-9]+(?= test)' "$OUT/cuda_tests.out" | tail -1)
record cuda_tests $STEP_RC $STEP_SECONDS "\"passed\": ${passed:-0}, \"failed\": ${nfail:-0}"

if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck initcheck; do
    step "$tool" 300 compute-sanitizer --tool "$tool" --error-exitcode 99 "$TESTS" \
      --gtest_filter='CudaOps.*:Cases/CudaFlashAttention.*-*real_*' --gtest_brief=1
    errs=$(grep -oP 'ERROR SUMMARY: \K[0-9]+' "$OUT/$tool.out" | tail -1)
    record "$tool" $STEP_RC $STEP_SECONDS "\"errors\": ${errs:-null}"
  done
else
  record compute_sanitizer 127 0 "\"why\": \"compute-sanitizer not on PATH\""
fi

# A tiny data set and config for the trainer comparisons (byte tokens, 2 layers).
DATA=$OUT/data
mkdir -p "$DATA"
"$CORPUS" --out "$DATA/corpus.txt" --seed 7 --megabytes 1 >>"$LOG" 2>&1 &&
  "$PREP" --tokenizer byte --input "$DATA/corpus.txt" --out "$DATA" >>"$LOG" 2>&1
cat >"$DATA/run.json" <<EOF
{"data": {"train": "$DATA/train.h5", "val": "$DATA/val.h5"},
 "model": {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 128, "seq_len": 128},
 "train": {"global_batch": 8, "steps": 50, "lr": 3e-3, "warmup_steps": 5, "eval_every": 0, "log_every": 1}}
EOF
common=(--config "$DATA/run.json" --set checkpoint.every=0)

step train_cpu 300 "$MPIEXEC" -n 1 "$TRAIN" "${common[@]}" --set run.dir="$OUT/run-cpu" --set runtime.device=cpu
record train_cpu $STEP_RC $STEP_SECONDS
step train_gpu 300 "$MPIEXEC" -n 1 "$TRAIN" "${common[@]}" --set run.dir="$OUT/run-gpu" --set runtime.device=cuda
gpu_rc=$STEP_RC; gpu_s=$STEP_SECONDS
# compare_losses A B: "steps_in_A steps_in_B largest_relative_difference" of two metrics.jsonl files.
compare_losses() {
  awk 'FNR==1{f++} match($0, /"loss": ?-?[0-9.eE+-]+/){v=substr($0,RSTART,RLENGTH); sub(/"loss": ?/,"",v); l[f, ++n[f]]=v+0}
    END{m=0; for(i=1;i<=n[1];i++){d=l[1,i]-l[2,i]; if(d<0)d=-d; a=l[1,i]<0?-l[1,i]:l[1,i]; r=a>0?d/a:d; if(r>m)m=r}
        printf "%d %d %.3g", n[1], n[2], m}' "$1" "$2" 2>/dev/null
}
# Step-by-step loss comparison from the two metrics.jsonl files (relative 1e-3).
cmp=$(compare_losses "$OUT/run-cpu/metrics.jsonl" "$OUT/run-gpu/metrics.jsonl")
read -r ncpu ngpu maxrel <<<"${cmp:-0 0 nan}"
if [ "$gpu_rc" = 0 ] && { [ "$ncpu" = 0 ] || [ "$ncpu" != "$ngpu" ] || awk -v m="$maxrel" 'BEGIN{exit !(m > 1e-3 || m != m)}'; }; then gpu_rc=3; fi
record train_gpu "$gpu_rc" "$gpu_s" "\"steps_cpu\": $ncpu, \"steps_gpu\": $ngpu, \"max_rel_loss_diff\": \"$maxrel\""

step mpi_staging 300 "$MPIEXEC" -n 2 "$TRAIN" "${common[@]}" --set run.dir="$OUT/run-mpi2" --set runtime.device=cuda \
  --set parallel.sync=allreduce --set parallel.overlap=false
record mpi_staging $STEP_RC $STEP_SECONDS
# ZeRO-1 through the same staging (reduce-scatter + all-gather): the losses of the run above (1e-5).
step mpi_staging_zero 300 "$MPIEXEC" -n 2 "$TRAIN" "${common[@]}" --set run.dir="$OUT/run-mpi2-zero" \
  --set runtime.device=cuda --set parallel.sync=allreduce --set parallel.overlap=false --set parallel.zero=1
zero_rc=$STEP_RC; zero_s=$STEP_SECONDS
cmp=$(compare_losses "$OUT/run-mpi2/metrics.jsonl" "$OUT/run-mpi2-zero/metrics.jsonl")
read -r nz0 nz1 zrel <<<"${cmp:-0 0 nan}"
if [ "$zero_rc" = 0 ] && { [ "$nz0" = 0 ] || [ "$nz0" != "$nz1" ] || awk -v m="$zrel" 'BEGIN{exit !(m > 1e-5 || m != m)}'; }; then zero_rc=3; fi
record mpi_staging_zero "$zero_rc" "$zero_s" "\"steps\": $nz1, \"max_rel_loss_diff_vs_zero0\": \"$zrel\""
step nccl_world1 300 "$MPIEXEC" -n 1 "$TRAIN" "${common[@]}" --set run.dir="$OUT/run-nccl" --set runtime.device=cuda \
  --set parallel.sync=nccl
record nccl_world1 $STEP_RC $STEP_SECONDS

for b in 8 16 32 64; do
  step "bench_b$b" 240 "$BENCH" --batch "$b" --json "$OUT/bench_b$b.json"
  tps=$(grep -oP '"tokens_per_s":\s*\K[0-9.e+]+' "$OUT/bench_b$b.json" 2>/dev/null | head -1)
  record "bench_b$b" $STEP_RC $STEP_SECONDS "\"tokens_per_s\": ${tps:-null}"
done
step bench_b8_full 240 "$BENCH" --batch 8 --attention full --json "$OUT/bench_b8_full.json"
tps=$(grep -oP '"tokens_per_s":\s*\K[0-9.e+]+' "$OUT/bench_b8_full.json" 2>/dev/null | head -1)
record bench_b8_full $STEP_RC $STEP_SECONDS "\"tokens_per_s\": ${tps:-null}"

echo "" >>"$JSON"; echo "]" >>"$JSON"
echo "gpu_verify: $failed step(s) failed; summary in $JSON" | tee -a "$LOG"
exit "$failed"
