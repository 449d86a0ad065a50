#!/usr/bin/env bash
# The trainer with runtime.device=cuda on the simulated card of tools/cuda_cpu_sim
# (build/sim-llmpi-train: llmpi-train linked with the CUDA backend's own source compiled for the
# CPU). What tools/gpu_verify.sh's `train` steps run on a GPU, on a smaller model: the losses of
# 1 rank, 2 ranks through the MPI host staging (allreduce, gather/scatter, ZeRO-1) and bf16
# against the CPU backend's, step by step; and the configuration the GPU refuses, refused. Not a
# GPU run (tools/cuda_cpu_sim/README.md says what the simulation cannot show).
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
  timeout 300 mpiexec -n "$np" "$prog" --config "$tmp/run.json" --set checkpoint.every=0 \
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

run cpu "$B/llmpi-train" 1 runtime.device=cpu
check "the CPU reference run" "[ $? = 0 ]" || exit $status
run cuda "$SIM" 1 runtime.device=cuda
check "runtime.device=cuda on the simulated card: 8 steps" "[ $? = 0 ] && grep -q 'device cuda: simulated H100' '$tmp/cuda.log'"
check "... its losses within 1e-4 of the CPU's" "losses_within cpu cuda 1e-4"
run mpi "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=false
check "2 ranks sharing the card, MPI_Allreduce through host staging: losses within 1e-4 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu mpi 1e-4"
run gather "$SIM" 2 runtime.device=cuda parallel.sync=gather_scatter
check "2 ranks, gather/scatter through rank 0: losses within 1e-4 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu gather 1e-4"
run zero "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=false parallel.zero=1
check "2 ranks, ZeRO-1 (reduce-scatter, all-gather): losses within 1e-5 of the allreduce run's" \
  "[ $? = 0 ] && losses_within mpi zero 1e-5"
run cpu_bf16 "$B/llmpi-train" 1 runtime.device=cpu runtime.precision=bf16 &&
  run cuda_bf16 "$SIM" 1 runtime.device=cuda runtime.precision=bf16
check "bf16 on the card against the CPU's emulation of it: losses within 1e-2 (the issue's bound)" \
  "[ $? = 0 ] && losses_within cpu_bf16 cuda_bf16 1e-2"
run overlap "$SIM" 2 runtime.device=cuda parallel.sync=allreduce parallel.overlap=true
rc=$?
check "overlap with an MPI method on the card: refused (non-zero exit), the message naming the fix" \
  "[ $rc != 0 ] && grep -q 'parallel.overlap=false' '$tmp/overlap.log' && [ ! -e '$tmp/overlap/metrics.jsonl' ]"
exit $status
