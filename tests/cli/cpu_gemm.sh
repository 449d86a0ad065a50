#!/usr/bin/env bash
# runtime.cpu_fp32_gemm "auto" in the real program under mpiexec -n 2, its real timing included.
# Whichever engine wins here (the choice from given times, and every rank taking rank 0's, is
# tests/test_mpi_cpu_gemm_auto.cpp):
#   a fresh run                  -> the banner names the engine, both times and OpenBLAS's core;
#                                   config.json and summary.json record the engine
#   --resume auto                -> the checkpoint's engine, not timed again; an explicit other
#                                   engine wins, with a warning
#   a model too small to time    -> not timed: OpenBLAS
#   OPENBLAS_CORETYPE=Prescott   -> a start-up warning naming OPENBLAS_CORETYPE (on an AVX2 CPU),
#                                   and the user's setting kept
#   OPENBLAS_CORETYPE unset      -> where OpenBLAS picks generic kernels on this CPU (one it does not
#                                   recognise), the run starts again on fitting ones and says so;
#                                   summary.json records the kernels the run used
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
TRAIN="$B/llmpi-train"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$B/llmpi-demo-corpus" --out "$tmp/c.txt" --seed 9 --megabytes 0.3 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/c.txt" --out "$tmp/d" >/dev/null 2>&1
# ~1.3 GFLOP of dense-layer GEMMs per step and rank: timed.
common=(--config data/demo.json --set data.train="$tmp/d/train.h5" --set data.val= --set model.n_layer=2
        --set model.seq_len=64 --set train.log_every=1 --set train.eval_every=0 --set checkpoint.every=2)
run_train() {  # OUT_NAME ARGS...: mpiexec -n 2 into $tmp/OUT_NAME.out (stdout and stderr), $rc
  local out=$1; shift
  timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" "$@" >"$tmp/$out.out" 2>&1; rc=$?
}
banner() { grep '^fp32 GEMMs: ' "$tmp/$1.out"; }
recorded() { grep -oP '"cpu_fp32_gemm": "\K[a-z]+' "$1/config.json"; }

run_train fresh --set run.dir="$tmp/run" --set train.steps=2
engine=$(recorded "$tmp/run")
if ldd "$TRAIN" | grep -q libdnnl; then
  check "a fresh run times both engines: the banner names them with their times and OpenBLAS's core" \
    "[ $rc = 0 ] && banner fresh | grep -qE 'runtime.cpu_fp32_gemm \"auto\" timed this run.s GEMMs: onednn [0-9.e+]+ ms, openblas [0-9.e+]+ ms per step .*OpenBLAS core [A-Za-z0-9_]+'" ||
    banner fresh
  check "... and config.json records the engine it names (here: $engine)" \
    "{ [ '$engine' = onednn ] && banner fresh | grep -q '^fp32 GEMMs: oneDNN'; } || { [ '$engine' = openblas ] && banner fresh | grep -q '^fp32 GEMMs: OpenBLAS sgemm'; }"
else
  check "a build without oneDNN: one candidate, not timed, OpenBLAS" \
    "[ $rc = 0 ] && [ '$engine' = openblas ] && banner fresh | grep -q 'has no oneDNN'"
fi
check "summary.json records it too" "grep -q '\"cpu_gemm_engine\": \"$engine\"' '$tmp/run/summary.json'"
core=$(grep -oP '"openblas_core": "\K[A-Za-z0-9_]+' "$tmp/run/summary.json")
if grep -q '^OpenBLAS kernels: .*set by llmpi-train' "$tmp/fresh.out"; then
  check "OpenBLAS picked generic kernels here: the run started again on the fitting ones ($core), said once" \
    "grep -q '^OpenBLAS kernels: $core, set by llmpi-train (OpenBLAS picked its [A-Za-z0-9]* kernels' '$tmp/fresh.out' && [ \$(grep -c '^OpenBLAS kernels:' '$tmp/fresh.out') = 1 ] && ! grep -q 'warning: OpenBLAS runs its' '$tmp/fresh.out'"
else
  check "OpenBLAS's own kernels fit this CPU: kept ($core), no note, no warning" \
    "[ -n '$core' ] && ! grep -q '^OpenBLAS kernels:' '$tmp/fresh.out' && ! grep -q 'warning: OpenBLAS runs its' '$tmp/fresh.out'"
fi

run_train resumed --set run.dir="$tmp/run" --set train.steps=4 --resume auto
check "--resume auto: the checkpoint's engine ($engine), not timed again" \
  "[ $rc = 0 ] && banner resumed | grep -q 'runtime.cpu_fp32_gemm \"auto\": the checkpoint.s engine, not timed again' && [ \"\$(recorded '$tmp/run')\" = '$engine' ]" ||
  banner resumed
other=$([ "$engine" = onednn ] && echo openblas || echo onednn)
if [ "$engine" = onednn ] || ldd "$TRAIN" | grep -q libdnnl; then
  run_train explicit --set run.dir="$tmp/run" --set train.steps=6 --resume auto --set runtime.cpu_fp32_gemm=$other
  check "an explicit $other over the checkpoint's $engine: used, with a warning, and recorded" \
    "[ $rc = 0 ] && grep -q 'warning: runtime.cpu_fp32_gemm \"$other\" replaces \"$engine\", the engine of checkpoint' '$tmp/explicit.out' && [ \"\$(recorded '$tmp/run')\" = '$other' ]"
fi

run_train small --set run.dir="$tmp/small" --set train.steps=1 --set model.d_model=32 --set model.n_layer=1 --set model.seq_len=32
check "a model too small to time: not timed, OpenBLAS" \
  "[ $rc = 0 ] && banner small | grep -q '^fp32 GEMMs: OpenBLAS sgemm: runtime.cpu_fp32_gemm \"auto\" not timed: under 100 MFLOP' && [ \"\$(recorded '$tmp/small')\" = openblas ]" ||
  banner small

if grep -qw avx2 /proc/cpuinfo; then
  OPENBLAS_CORETYPE=Prescott run_train prescott --set run.dir="$tmp/prescott" --dry-run
  check "OpenBLAS on its generic Prescott kernels: a start-up warning naming OPENBLAS_CORETYPE, once" \
    "[ $rc = 0 ] && [ \$(grep -c 'warning: OpenBLAS runs its Prescott kernels (SSE) on this CPU.*set OPENBLAS_CORETYPE=' '$tmp/prescott.out') = 1 ] && ! grep -q '^OpenBLAS kernels:' '$tmp/prescott.out'" ||
    cat "$tmp/prescott.out"
else
  skip "the OpenBLAS warning (this CPU has no AVX2)"
fi
exit $status
