#!/usr/bin/env bash
# Records the bits a change to the model code must keep: every family x fp32/bf16 x recompute
# none/selective/full, tensor parallelism 2 with and without sequence parallelism, pipelines of
# 2 stages (1f1b and zb-h1), on the CPU backend and on the simulated card of tools/cuda_cpu_sim,
# 10 steps of a tiny model each. Per configuration it writes the losses and gradient norms of
# every step as the run logged them (metrics.jsonl: the float's 17 digits) and a digest of every
# dataset of the final checkpoint (h5dump with %.17g, attributes left out: they hold times and
# paths). One thread per rank and fixed CPU GEMM engines (OpenBLAS for fp32, oneDNN for bf16), so
# two records of the same build are equal; a change that keeps every bit keeps the record.
#
#   tools/model_bits.sh OUT            write the record to OUT (a file; refused if it exists)
#   tools/model_bits.sh OUT --against REF   and compare it with REF, naming every difference
#
# Needs the binaries (make binaries: build/llmpi-train, build/sim-llmpi-train) and h5dump
# (Debian's hdf5-tools). Takes a few minutes on 2 cores.
set -uo pipefail
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case $1 in -h | --help) usage; exit 0 ;; esac
out=$1; shift
ref=
if [ $# -gt 0 ]; then
  [ "$1" = --against ] && [ $# -eq 2 ] || { echo "model_bits.sh: usage: OUT [--against REF]" >&2; exit 2; }
  ref=$2
  [ -f "$ref" ] || { echo "model_bits.sh: no record at $ref: write one first (tools/model_bits.sh $ref)" >&2; exit 2; }
fi
[ -e "$out" ] && { echo "model_bits.sh: $out exists; give a new path (the record is never overwritten)" >&2; exit 2; }
source "$(dirname "$0")/../tests/cli/lib.bash"  # ($B, tiny_rte, one thread per process)
for p in "$B/llmpi-train" "$B/sim-llmpi-train" "$B/llmpi-prep" "$B/llmpi-demo-corpus"; do
  [ -x "$p" ] || { echo "model_bits.sh: $p missing: run make binaries first" >&2; exit 2; }
done
command -v h5dump >/dev/null || { echo "model_bits.sh: h5dump missing: apt-get install hdf5-tools" >&2; exit 2; }

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$B/llmpi-demo-corpus" --out "$tmp/corpus.txt" --seed 7 --megabytes 1 >/dev/null &&
  "$B/llmpi-prep" --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/lm" >/dev/null ||
  { echo "model_bits.sh: preparing the language-model data failed" >&2; exit 1; }
tiny_rte "$tmp/rte"  # (for bert)
"$B/llmpi-prep" glue --task rte --data-dir "$tmp/rte" \
  --tokenizer "hf:tests/fixtures/hf_tokenizers/wordpiece_small/tokenizer.json" --max-seq-len 16 --out "$tmp/cls" \
  >/dev/null || { echo "model_bits.sh: preparing the classification data failed" >&2; exit 1; }

for family in gpt2 llama bert; do
  data="\"train\": \"$tmp/lm/train.h5\", \"val\": \"$tmp/lm/val.h5\""
  model="\"family\": \"$family\", \"n_layer\": 4, \"n_head\": 2, \"d_model\": 32, \"seq_len\": 16"
  if [ $family = bert ]; then
    data="\"train\": \"$tmp/cls/train.h5\", \"val\": \"$tmp/cls/dev.h5\""
    model="$model, \"num_labels\": 2"
  fi
  cat >"$tmp/$family.json" <<JSON
{"data": {$data}, "model": {$model},
 "train": {"global_batch": 8, "steps": 10, "lr": 3e-3, "warmup_steps": 2, "eval_every": 5, "eval_batches": 1,
           "log_every": 1},
 "runtime": {"threads": 1, "cpu_fp32_gemm": "openblas", "cpu_bf16_gemm": "onednn"},
 "checkpoint": {"every": 10, "async": false}}
JSON
done

# record NAME FAMILY PROGRAM RANKS SETTINGS...: one configuration's lines of the record
record() {
  local name=$1 family=$2 prog=$3 np=$4; shift 4
  local sets=(); for s in "$@"; do sets+=(--set "$s"); done
  echo "== $name: $family $(basename "$prog") -n $np $*"
  if ! timeout -k 5 300 mpiexec -n "$np" "$prog" --config "$tmp/$family.json" --set run.dir="$tmp/$name" \
      "${sets[@]}" >"$tmp/$name.log" 2>&1; then
    echo "exit $?: $(grep -m1 -i 'error' "$tmp/$name.log")"
    return
  fi
  awk 'match($0, /"loss": ?-?[0-9.eE+-]+/) { l = substr($0, RSTART, RLENGTH) }
       match($0, /"grad_norm": ?-?[0-9.eE+-]+/) { g = substr($0, RSTART, RLENGTH) }
       match($0, /"step": ?[0-9]+/) { print substr($0, RSTART, RLENGTH), l, g }' "$tmp/$name/metrics.jsonl"
  awk 'match($0, /"(val_)?loss": ?-?[0-9.eE+-]+/) { print "eval", substr($0, RSTART, RLENGTH) }' \
    "$tmp/$name/eval.jsonl" 2>/dev/null
  local ck; ck=$(find "$tmp/$name" -name '*.h5' -path '*checkpoint*' | sort | tail -1)
  if [ -n "$ck" ]; then
    echo "checkpoint $(basename "$ck") $(h5dump -A 0 -m '%.17g' "$ck" | sed 1d | sha256sum | cut -c1-32)"
  else
    echo "checkpoint none"
  fi
}

sim=$B/sim-llmpi-train cpu=$B/llmpi-train
{
  for family in gpt2 llama bert; do
    for prec in fp32 bf16; do
      for rc in none selective full; do
        record "$family-cpu-$prec-$rc" $family "$cpu" 1 runtime.precision=$prec runtime.recompute=$rc
      done
      record "$family-cpu-$prec-tp2" $family "$cpu" 2 runtime.precision=$prec parallel.tp=2
      record "$family-cpu-$prec-tp2-sp" $family "$cpu" 2 runtime.precision=$prec parallel.tp=2 \
        parallel.sequence_parallel=true
      record "$family-cpu-$prec-tp2-sp-selective" $family "$cpu" 2 runtime.precision=$prec parallel.tp=2 \
        parallel.sequence_parallel=true runtime.recompute=selective
      record "$family-cpu-$prec-pp2-1f1b-full" $family "$cpu" 2 runtime.precision=$prec parallel.pp_stages=2 \
        parallel.microbatches=4 parallel.schedule=1f1b runtime.recompute=full
      record "$family-cpu-$prec-pp2-zbh1" $family "$cpu" 2 runtime.precision=$prec parallel.pp_stages=2 \
        parallel.microbatches=4 parallel.schedule=zb-h1
      record "$family-cpu-$prec-tp2-pp2" $family "$cpu" 4 runtime.precision=$prec parallel.tp=2 \
        parallel.pp_stages=2 parallel.microbatches=2
    done
    for prec in fp32 bf16; do
      record "$family-sim-$prec-none" $family "$sim" 1 runtime.device=cuda runtime.precision=$prec
      record "$family-sim-$prec-selective" $family "$sim" 1 runtime.device=cuda runtime.precision=$prec \
        runtime.recompute=selective
      record "$family-sim-$prec-full" $family "$sim" 1 runtime.device=cuda runtime.precision=$prec \
        runtime.recompute=full
      record "$family-sim-$prec-tp2-sp" $family "$sim" 2 runtime.device=cuda runtime.precision=$prec parallel.tp=2 \
        parallel.sequence_parallel=true
      record "$family-sim-$prec-pp2-zbh1" $family "$sim" 2 runtime.device=cuda runtime.precision=$prec \
        parallel.pp_stages=2 parallel.microbatches=4 parallel.schedule=zb-h1
    done
  done
} >"$out.part"
mv "$out.part" "$out"
echo "model_bits.sh: $(grep -c '^==' "$out") configurations, $(grep -c '^exit' "$out") refused, record in $out"
if [ -n "$ref" ]; then
  if diff "$ref" "$out" >"$tmp/diff"; then
    echo "model_bits.sh: the same bits as $ref in every configuration"
  else
    echo "model_bits.sh: differences from $ref:"; cat "$tmp/diff"; exit 1
  fi
fi
