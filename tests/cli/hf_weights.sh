#!/usr/bin/env bash
# Hugging Face weights through the real programs: llmpi-train --init-from a fixture model
# (tests/fixtures/hf/*, tiny models saved by transformers) on 2 ranks, llmpi-export of the run's
# checkpoint, and the errors of both.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
FX=tests/fixtures/hf

"$B/llmpi-demo-corpus" --out "$tmp/a.txt" --seed 3 --megabytes 0.1 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/a.txt" --out "$tmp/d" >/dev/null 2>&1
cat >"$tmp/run.json" <<JSON
{"data": {"train": "$tmp/d/train.h5"}, "model": {"seq_len": 32},
 "train": {"steps": 2, "global_batch": 4, "lr": 0.0, "weight_decay": 0.0, "log_every": 1, "eval_every": 0},
 "checkpoint": {"every": 2}, "runtime": {"trace_steps": 0}}
JSON

for fam in gpt2 llama; do
  # lr 0: the checkpoint after two steps holds exactly the imported parameters.
  timeout 240 mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from $FX/$fam \
    --set run.dir="$tmp/run-$fam" >"$tmp/train-$fam.out" 2>&1
  check "$fam: 2-rank training from --init-from: exit 0" "[ $? = 0 ]"
  check "$fam: the model is the fixture's (config.json filled model.*)" \
    "grep -q 'model $fam: 2 layers' '$tmp/train-$fam.out' && grep -q '\"vocab_size\": 320' '$tmp/run-$fam/config.json'"
  check "$fam: the run records its --init-from directory" "grep -q 'fixtures/hf/$fam' '$tmp/run-$fam/init_from.json'"
  "$B/llmpi-export" --checkpoint "$tmp/run-$fam" --out "$tmp/exp-$fam" >"$tmp/exp-$fam.out" 2>&1
  check "$fam: llmpi-export of the run's newest checkpoint: exit 0" "[ $? = 0 ] && [ -s '$tmp/exp-$fam/model.safetensors' ]"
  check "$fam: config.json carries the data's end-of-text id" "grep -q '\"eos_token_id\": 256' '$tmp/exp-$fam/config.json'"
  "$B/llmpi-export" --hf-dir $FX/$fam --out "$tmp/direct-$fam" >/dev/null 2>&1
  check "$fam: import+train(lr 0)+export = import+export, byte for byte" \
    "cmp -s '$tmp/exp-$fam/model.safetensors' '$tmp/direct-$fam/model.safetensors'"
done

# An export trains again (its config.json and tensors are what --init-from reads).
timeout 240 mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/exp-gpt2" \
  --set run.dir="$tmp/run-again" >"$tmp/again.out" 2>&1
check "an llmpi export is a valid --init-from directory" "[ $? = 0 ]"

# Errors: one line, exit 2 on every rank.
timeout 120 mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from $FX/llama --set model.n_layer=3 \
  --set run.dir="$tmp/run-x" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "a model key that contradicts config.json: exit 2 naming both" \
  "[ $rc = 2 ] && grep -q \"'model.n_layer' is set to 3 but '$FX/llama/config.json' has 2\" '$tmp/err'"
check "... said once" "[ \$(grep -c 'llmpi-train: error' '$tmp/err') = 1 ]"
timeout 120 mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/nowhere" \
  --set run.dir="$tmp/run-y" >"$tmp/out" 2>"$tmp/err"
check "--init-from a missing directory: exit 2 naming config.json" "[ $? = 2 ] && grep -q 'nowhere/config.json' '$tmp/err'"
mkdir -p "$tmp/broken" && cp $FX/gpt2/config.json "$tmp/broken/" && head -c 1000 $FX/gpt2/model.safetensors >"$tmp/broken/model.safetensors"
timeout 120 mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/broken" \
  --set run.dir="$tmp/run-z" >"$tmp/out" 2>"$tmp/err"
check "a truncated model.safetensors: exit 2 naming the file" "[ $? = 2 ] && grep -q 'broken/model.safetensors' '$tmp/err'"
"$B/llmpi-export" --checkpoint "$tmp/none.h5" --out "$tmp/e" >/dev/null 2>"$tmp/err"
check "llmpi-export of a missing checkpoint: exit 2" "[ $? = 2 ] && grep -q 'llmpi-export: error' '$tmp/err'"
"$B/llmpi-export" --hf-dir $FX/bert --out "$tmp/eb" --tokenizer-files "$tmp" >/dev/null 2>"$tmp/err"
check "llmpi-export --tokenizer-files without tokenizer files: exit 2" "[ $? = 2 ] && grep -q 'holds none of' '$tmp/err'"
mkdir -p "$tmp/tok" && echo '{"model": {}}' >"$tmp/tok/tokenizer.json" && printf '[PAD]\n' >"$tmp/tok/vocab.txt"
"$B/llmpi-export" --hf-dir $FX/bert --out "$tmp/ebt" --tokenizer-files "$tmp/tok" >/dev/null 2>&1
check "llmpi-export --tokenizer-files copies tokenizer.json and vocab.txt" \
  "[ $? = 0 ] && cmp -s '$tmp/tok/tokenizer.json' '$tmp/ebt/tokenizer.json' && cmp -s '$tmp/tok/vocab.txt' '$tmp/ebt/vocab.txt'"
[ $status = 0 ] || { cat "$tmp"/train-*.out; cat "$tmp/err"; }
exit $status
