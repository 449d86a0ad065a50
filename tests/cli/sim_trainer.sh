#!/usr/bin/env bash
# The trainer with runtime.device=cuda on the simulated card of tools/cuda_cpu_sim
# (build/sim-llmpi-train: llmpi-train linked with the CUDA backend's own source compiled for the
# CPU). What tools/gpu_verify.sh's `train` steps run on a GPU, on a smaller model: the losses of
# 1 rank, 2 ranks through the MPI host staging (allreduce, gather/scatter, ZeRO-1), 2 ranks
# through NCCL (the simulator's, over MPI: buckets on the communication stream during backward;
# fp32 and bf16 gradients) and bf16 against the CPU backend's, step by step; gradient
# accumulation against one batch; and the configuration the GPU refuses, refused. Not a GPU run
# (tools/cuda_cpu_sim/README.md says what the simulation cannot show).
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
SIM="$B/sim-llmpi-train"
[ -x "$SIM" ] || { echo "FAIL $SIM missing (make binaries)"; exit 1; }

"$B/llmpi-demo-corpus" --out "$tmp/corpus.txt" --seed 7 --megabytes 1 >/dev/null &&
  "$B/llmpi-prep" --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp" >/dev/null
check "data prepared" "[ -f '$tmp/train.h5' ]" || exit $status
cat >"$tmp/run.json" <<JSON
{"data": {"train": "$tmp/train.h5", "val": "$tmp/val.h5"},
 "model": {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 64, "seq_len": 64},
 "train": {"global_batch": 4, "steps": 8, "lr": 3e-3, "warmup_steps": 2, "eval_every": 0, "log_every": 1},
 "run": {"dir": "$tmp/run"}}
JSON

# run NAME PROGRAM RANKS SETTINGS...: a run into $tmp/NAME, its exit status returned
run() {
  local name=$1 prog=$2 np=$3; shift 3
  local sets=(); for s in "$@"; do sets+=(--set "$s"); done
  timeout $((300 * TIME_SCALE)) mpiexec -n "$np" "$prog" --config "$tmp/run.json" --set checkpoint.every=0 \
    --set run.dir="$tmp/$name" "${sets[@]}" >"$tmp/$name.log" 2>&1
}
# losses_within A B TOL: both runs logged 8 losses, each of B within TOL (relative) of A's
losses_within() {
  awk -v tol="$3" 'FNR == 1 {f++} match($0, /"loss": ?-?[0-9.eE+-]+/) {
      v = substr($0, RSTART + 7, RLENGTH - 7); l[f, ++n[f]] = v + 0 }
    END { if (n[1] != 8 || n[2] != 8) exit 1
          for (i = 1; i <= 8; i++) { d = l[1, i] - l[2, i]; d = d < 0 ? -d : d
            a = l[1, i] < 0 ? -l[1, i] : l[1, i]; if (!(d <= tol * a)) exit 1 } }' \
    "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl"
}

# several_buckets RUN: every step of the run made two collectives or more
several_buckets() {
  awk 'match($0, /"collectives": ?[0-9]+/) { n++; if (substr($0, RSTART + 14, RLENGTH - 14) + 0 < 2) bad = 1 }
       END { exit !(n == 8 && !bad) }' "$tmp/$1/metrics.jsonl"
}

# bytes_sent RUN: the first step's bytes_sent
bytes_sent() { awk 'match($0, /"bytes_sent": ?[0-9.eE+]+/) { print substr($0, RSTART + 13, RLENGTH - 13) + 0; exit }' "$tmp/$1/metrics.jsonl"; }

run cpu "$B/llmpi-train" 1 runtime.device=cpu
check "the CPU reference run" "[ $? = 0 ]" || exit $status
run cuda "$SIM" 1 runtime.device=cuda
check "runtime.device=cuda on the simulated card: 8 steps" "[ $? = 0 ] && grep -q 'device cuda: simulated H100' '$tmp/cuda.log'"
check "... its losses within 1e-4 of the CPU's" "losses_within cpu cuda 1e-4"
check "... the banner names the CUDA paths and summary.json records each (cuDNN's off: no cuDNN here)" \
  "grep -q '^CUDA paths: ' '$tmp/cuda.log' && grep -A3 '\"name\": \"cudnn_attention\"' '$tmp/cuda/summary.json' | grep -q '\"on\": false'"
run mpi "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=false
check "2 ranks sharing the card, MPI_Allreduce through host staging: losses within 1e-4 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu mpi 1e-4"
run gather "$SIM" 2 runtime.device=cuda parallel.sync=gather_scatter
check "2 ranks, gather/scatter through rank 0: losses within 1e-4 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu gather 1e-4"
run zero "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=false parallel.zero=1
check "2 ranks, ZeRO-1 (reduce-scatter, all-gather): losses within 1e-5 of the allreduce run's" \
  "[ $? = 0 ] && losses_within mpi zero 1e-5"
run nccl "$SIM" 2 runtime.device=cuda parallel.sync=nccl parallel.bucket_mb=0.02
check "2 ranks, parallel.sync=nccl (buckets during backward): losses within 1e-4 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu nccl 1e-4 && grep -q '^sync: nccl' '$tmp/nccl.log' && several_buckets nccl"
check "... and equal to the MPI allreduce run's (at 2 ranks an average has one rounding)" "losses_within mpi nccl 0"
run cpu_gbf16 "$B/llmpi-train" 2 runtime.device=cpu parallel.sync=allreduce parallel.grad_dtype=bf16 &&
  run nccl_gbf16 "$SIM" 2 runtime.device=cuda parallel.sync=nccl parallel.bucket_mb=0.02 parallel.grad_dtype=bf16
check "2 ranks, nccl with bf16 gradients: losses within 1e-4 of the CPU's allreduce with bf16 gradients" \
  "[ $? = 0 ] && losses_within cpu_gbf16 nccl_gbf16 1e-4 && several_buckets nccl_gbf16"
check "... sending half the bytes of the fp32 nccl run" \
  "[ \"\$(bytes_sent nccl_gbf16)\" = \"\$(bytes_sent nccl | awk '{ print \$1 / 2 }')\" ]"
run cpu_bf16 "$B/llmpi-train" 1 runtime.device=cpu runtime.precision=bf16 &&
  run cuda_bf16 "$SIM" 1 runtime.device=cuda runtime.precision=bf16
check "bf16 on the card against the CPU's emulation of it: losses within 1e-2 (the issue's bound)" \
  "[ $? = 0 ] && losses_within cpu_bf16 cuda_bf16 1e-2"
# Gradient accumulation on the card: 2 micro-batches of 1 per rank against one batch of 2 (the
# issue's bound: the same training within 1e-6), on 1 rank and on 2 ranks through the MPI staging.
run mpi_acc "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=false parallel.microbatches=2
check "2 ranks, gradient accumulation over 2 micro-batches: losses within 1e-6 of one batch's" \
  "[ $? = 0 ] && losses_within mpi mpi_acc 1e-6"
run cuda_acc "$SIM" 1 runtime.device=cuda parallel.microbatches=4
check "1 rank, gradient accumulation over 4 micro-batches: losses within 1e-6 of one batch's" \
  "[ $? = 0 ] && losses_within cuda cuda_acc 1e-6"
run overlap "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=true
rc=$?
check "overlap with an MPI method on the card: refused (non-zero exit), the message naming the fix" \
  "[ $rc != 0 ] && grep -q 'parallel.overlap=false' '$tmp/overlap.log' && [ ! -e '$tmp/overlap/metrics.jsonl' ]"
exit $status
