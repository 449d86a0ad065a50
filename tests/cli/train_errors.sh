#!/usr/bin/env bash
# llmpi-train on bad input, under mpiexec -n 2: one clear message (printed once), non-zero exit;
# --help tells the truth and exits 0.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
TRAIN=$(realpath "$BUILD/llmpi-train")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# expect_error NAME NEEDLE ARGS... : run, require exit != 0 and NEEDLE exactly once in stderr.
expect_error() {
  local name=$1 needle=$2; shift 2
  timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local n; n=$(grep -cF -- "$needle" "$tmp/err")
  if [ $rc = 0 ] || [ $rc = 124 ] || [ "$n" != 1 ]; then
    echo "FAIL $name: exit $rc, '$needle' found $n times in stderr:"; cat "$tmp/err"; status=1
  else echo "ok   $name: exit $rc: $(grep -F -- "$needle" "$tmp/err")"; fi
}

# Each configuration names a run.dir under $tmp: the default (runs/default) may hold a user's run,
# whose run-directory check must not answer before the error a check expects.
printf '{"data": {"train": "x.h5"},, }' >"$tmp/malformed.json"
printf '{"data": {"train": "x.h5"}, "train": {"stpes": 3}, "run": {"dir": "%s/run"}}' "$tmp" >"$tmp/unknown.json"
printf '{"data": {"train": "x.h5"}, "model": {"n_layer": "four"}, "run": {"dir": "%s/run"}}' "$tmp" >"$tmp/type.json"
printf '{"data": {"train": "%s/missing.h5"}, "run": {"dir": "%s/run"}}' "$tmp" "$tmp" >"$tmp/missing.json"
printf 'not hdf5 at all\n' >"$tmp/fake.h5"
printf '{"data": {"train": "%s/fake.h5"}, "run": {"dir": "%s/run"}}' "$tmp" "$tmp" >"$tmp/fake.json"

expect_error malformed-json "malformed JSON" --config "$tmp/malformed.json"
expect_error unknown-key "did you mean 'train.steps'" --config "$tmp/unknown.json"
expect_error wrong-type "'model.n_layer' must be an integer" --config "$tmp/type.json"
expect_error missing-config "cannot read config file" --config "$tmp/none.json"
expect_error missing-data "missing.h5" --config "$tmp/missing.json"
expect_error not-hdf5 "fake.h5" --config "$tmp/fake.json"
expect_error bad-set "unknown key 'train.lrr'" --config "$tmp/missing.json" --set train.lrr=1
expect_error no-config "--config is required"
expect_error other-family-key "'model.rope_theta' does not apply to model.family \"gpt2\"" --config "$tmp/missing.json" --set model.rope_theta=500
expect_error unknown-family "'model.family' must be \"gpt2\", \"llama\" or \"bert\"" --config "$tmp/missing.json" --set model.family=t5
expect_error bad-attention "'runtime.attention' must be \"auto\", \"full\" or \"fused\"" --config "$tmp/missing.json" --set runtime.attention=flash
expect_error gqa-divides "'model.n_kv_head' (4) must divide 'model.n_head' (6)" --config "$tmp/missing.json" --set model.family=llama --set model.n_head=6 --set model.d_model=96 --set model.n_kv_head=4
expect_error pp-divides "parallel.pp_stages 3 does not divide the 2 ranks" --config "$tmp/missing.json" --set parallel.pp_stages=3
expect_error pp-schedule "'parallel.schedule' must be \"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\"" --config "$tmp/missing.json" --set parallel.schedule=pipedream
expect_error zero-value "or 3 (ZeRO-3: and of the blocks' parameters), got 4" --config "$tmp/missing.json" --set parallel.zero=4
expect_error zero-weights "\"weights\" gives every rank its own optimizer over every parameter" --config "$tmp/missing.json" --set parallel.zero=1 --set parallel.sync=weights
expect_error grad-dtype-value "'parallel.grad_dtype' must be \"fp32\" or \"bf16\"" --config "$tmp/missing.json" --set parallel.grad_dtype=fp16
expect_error grad-dtype-method "\"bf16\" is implemented for parallel.sync \"allreduce\" (with or without zero 1) and \"nccl\", not \"gather_scatter\"" --config "$tmp/missing.json" --set parallel.grad_dtype=bf16 --set parallel.sync=gather_scatter
expect_error precision-value "'runtime.precision' must be \"fp32\", \"tf32\" or \"bf16\"" --config "$tmp/missing.json" --set runtime.precision=fp16
expect_error precision-tf32-cpu "\"tf32\" is a CUDA tensor-core mode; use \"fp32\" or \"bf16\" with runtime.device \"cpu\"" --config "$tmp/missing.json" --set runtime.precision=tf32 --set runtime.device=cpu
expect_error recompute-value "'runtime.recompute' must be \"none\", \"selective\" or \"full\"" --config "$tmp/missing.json" --set runtime.recompute=some
expect_error recompute-zb-h1 "'runtime.recompute' \"full\" is not implemented with parallel.schedule \"zb-h1\"" --config "$tmp/missing.json" --set parallel.pp_stages=2 --set parallel.schedule=zb-h1 --set runtime.recompute=full
expect_error cpu-bf16-gemm-value "'runtime.cpu_bf16_gemm' must be \"auto\", \"onednn\" or \"emulate\"" --config "$tmp/missing.json" --set runtime.cpu_bf16_gemm=mkl
expect_error batch-both "'train.global_batch' (64) and 'train.batch_per_rank' (16) are both set, but 16 per replica × 2 data-parallel replicas is a global batch of 32" --config "$tmp/missing.json" --set train.global_batch=64 --set train.batch_per_rank=16
expect_error lr-scaling-reference "set train.lr_reference_batch to that global batch" --config "$tmp/missing.json" --set train.lr_scaling=linear
expect_error n-layer-2e9 "'model.n_layer' must be in 1..10000" --config "$tmp/missing.json" --set model.n_layer=2000000000 --dry-run
expect_error cpu-fp32-gemm-value "'runtime.cpu_fp32_gemm' must be \"auto\", \"onednn\" or \"openblas\"" --config "$tmp/missing.json" --set runtime.cpu_fp32_gemm=mkl
# runtime.device "auto" that resolves to the CPU: refused by the trainer once the ranks agree on the device
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error precision-tf32-auto "\"tf32\" is a CUDA tensor-core mode, but this run is on the CPU" --config "$tmp/missing.json" --set runtime.precision=tf32
fi

timeout $((60 * TIME_SCALE)) mpiexec -n 1 "$TRAIN" --help >"$tmp/help" 2>&1; rc=$?
if [ $rc != 0 ] || ! grep -q "train.global_batch" "$tmp/help" || ! grep -q "parallel.sync" "$tmp/help" ||
   ! grep -q "^ llama:" "$tmp/help" || ! grep -q "^ bert:" "$tmp/help" || ! grep -q "model.n_kv_head" "$tmp/help" ||
   ! grep -q "model.num_labels  *default 2" "$tmp/help" || ! grep -q "parallel.pp_stages" "$tmp/help" || ! grep -q "parallel.zero" "$tmp/help" ||
   ! grep -q "runtime.precision" "$tmp/help" || ! grep -q "runtime.cpu_bf16_gemm" "$tmp/help" ||
   ! grep -q "runtime.cpu_fp32_gemm" "$tmp/help"; then
  echo "FAIL --help: exit $rc"; cat "$tmp/help"; status=1
else echo "ok   --help lists the configuration keys, per model family"; fi
exit $status
