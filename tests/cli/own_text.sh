#!/usr/bin/env bash
# docs/OWN_TEXT.md's path, with its commands and examples/run.json (and run-bpe.json where GPT-2's
# BPE files are in the shared data folder), shortened with --set only: text -> token files -> a
# 2-rank CPU run -> a sample. The run exits 0, its loss falls, it leaves metrics.jsonl, TensorBoard
# event files, a checkpoint and summary.json in run.dir, and llmpi-sample generates from it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
root=$PWD
DATA=$(realpath -m "$DATA")
cd "$tmp" && ln -s "$B" build && ln -s "$root/examples" examples

# A text of one's own: the demo corpus stands in for input.txt.
build/llmpi-demo-corpus --out input.txt --seed 11 --megabytes 0.3 >/dev/null
timeout $((120 * TIME_SCALE)) build/llmpi-prep --tokenizer byte --input input.txt --out data/mytext >prep.out 2>&1
check "byte tokens: llmpi-prep writes data/mytext (train and val)" \
  "[ \$? = 0 ] && [ -e data/mytext/train.h5 ] && [ -e data/mytext/val.h5 ]" || cat prep.out

short=(--set train.steps=40 --set train.log_every=5 --set train.eval_every=20 --set train.eval_batches=2
       --set checkpoint.every=40 --set train.warmup_steps=5)
timeout $((300 * TIME_SCALE)) mpiexec -n 2 build/llmpi-train --config examples/run.json \
  --set data.train=data/mytext --set data.val=data/mytext/val "${short[@]}" >train.out 2>&1
check "mpiexec -n 2 llmpi-train --config examples/run.json: exit 0" "[ \$? = 0 ]" || tail -20 train.out
first=$(head -1 runs/mytext/metrics.jsonl | grep -oP '"loss":\s*\K[0-9.]+')
last=$(tail -1 runs/mytext/metrics.jsonl | grep -oP '"loss":\s*\K[0-9.]+')
check "the loss falls over 40 steps ($first -> $last)" "awk 'BEGIN { exit !($last < $first - 0.5) }'"
check "run.dir holds config.json, eval.jsonl, summary.json, TensorBoard events and the step-40 checkpoint" \
  "[ -s runs/mytext/config.json ] && [ -s runs/mytext/eval.jsonl ] && [ -s runs/mytext/summary.json ] &&
   ls runs/mytext/events.out.tfevents.* >/dev/null 2>&1 && ls runs/mytext/checkpoints/step-00000040* >/dev/null 2>&1"

timeout $((120 * TIME_SCALE)) build/llmpi-sample --init-from runs/mytext --prompt "Once" --max-new-tokens 40 \
  --temperature 0.8 --top-k 40 >sample.out 2>sample.err
check "llmpi-sample --init-from runs/mytext: exit 0 and text after the prompt" \
  "[ \$? = 0 ] && [ \$(wc -c <sample.out) -gt 30 ] && grep -q '^Once' sample.out" || cat sample.err

if [ -e "$DATA/gpt2/encoder.json" ] && [ -e "$DATA/gpt2/vocab.bpe" ]; then
  mkdir -p gpt2 && cp "$DATA/gpt2/encoder.json" "$DATA/gpt2/vocab.bpe" gpt2/
  timeout $((120 * TIME_SCALE)) build/llmpi-prep --tokenizer gpt2 --gpt2-encoder gpt2/encoder.json \
    --gpt2-merges gpt2/vocab.bpe --input input.txt --out data/mytext-bpe >prep-bpe.out 2>&1
  check "GPT-2 BPE tokens: llmpi-prep writes data/mytext-bpe" "[ \$? = 0 ] && [ -e data/mytext-bpe/train.h5 ]" ||
    cat prep-bpe.out
  timeout $((300 * TIME_SCALE)) mpiexec -n 2 build/llmpi-train --config examples/run-bpe.json \
    --set data.train=data/mytext-bpe --set data.val=data/mytext-bpe/val --set train.steps=4 --set train.log_every=1 \
    --set train.eval_every=4 --set train.eval_batches=1 --set checkpoint.every=4 >train-bpe.out 2>&1
  check "mpiexec -n 2 llmpi-train --config examples/run-bpe.json: exit 0, vocabulary 50257" \
    "[ \$? = 0 ] && grep -q 50257 train-bpe.out" || tail -20 train-bpe.out
  timeout $((120 * TIME_SCALE)) build/llmpi-sample --init-from runs/mytext-bpe --gpt2-encoder gpt2/encoder.json \
    --gpt2-merges gpt2/vocab.bpe --prompt "Once upon a time" --max-new-tokens 8 >sample-bpe.out 2>sample-bpe.err
  check "llmpi-sample from the BPE run with GPT-2's files: exit 0 and text after the prompt" \
    "[ \$? = 0 ] && grep -q '^Once upon a time' sample-bpe.out" || cat sample-bpe.err
else
  skip "the GPT-2 BPE path: $DATA/gpt2/encoder.json and vocab.bpe not found"
fi
exit $status
