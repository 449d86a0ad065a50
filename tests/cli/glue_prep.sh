#!/usr/bin/env bash
# llmpi-prep glue through the real programs: its errors (exit 1, one message naming file and
# line), RTE from the shared GLUE data with all-MiniLM-L6-v2's tokenizer (`make pretrained`), and a
# short 2-rank fine-tune of the pretrained model on the result that reports accuracy. Parts that
# need the shared data or the pretrained model skip with a message when they are absent.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
TOK=tests/fixtures/hf_tokenizers/wordpiece_small/tokenizer.json
MINILM=pretrained/all-MiniLM-L6-v2

# Errors, with the small fixture tokenizer.
mkdir -p "$tmp/bad"
printf 'index\tsentence1\tsentence2\tlabel\n0\t"A cat.\tA cat.\tentailment\n1\tA dog.\tA dog.\tunsure\n' >"$tmp/bad/train.tsv"
cp "$tmp/bad/train.tsv" "$tmp/bad/dev.tsv"
"$B/llmpi-prep" glue --task rte --data-dir "$tmp/bad" --tokenizer "hf:$TOK" --out "$tmp/o" >/dev/null 2>"$tmp/err"
check "an unknown label: exit 1 naming file and line" \
  "[ $? = 1 ] && grep -q \"$tmp/bad/train.tsv:3: unknown label 'unsure'\" '$tmp/err' && [ \$(wc -l <'$tmp/err') = 1 ]"
check "... and nothing written" "[ ! -e '$tmp/o/train.h5' ] && [ ! -e '$tmp/o/dev.h5' ]"
"$B/llmpi-prep" glue --task mnli --data-dir "$tmp/bad" --tokenizer "hf:$TOK" --out "$tmp/o" >/dev/null 2>"$tmp/err"
check "an unknown task lists the known ones" "[ $? = 1 ] && grep -q 'known tasks: rte, mrpc, sst-2, qnli, cola' '$tmp/err'"
"$B/llmpi-prep" glue --task cola --data-dir "$tmp/bad" --tokenizer "hf:$TOK" --out "$tmp/o" >/dev/null 2>"$tmp/err"
check "another task's file: exit 1 naming file and line" "[ $? = 1 ] && grep -q \"$tmp/bad/train.tsv:1: \" '$tmp/err'"
"$B/llmpi-prep" --help | grep -q "GLUE" && "$B/llmpi-prep" glue --help | grep -q -- "--max-seq-len"
check "--help documents glue" "[ $? = 0 ]"

if [ ! -f "$DATA/glue/RTE/train.tsv" ]; then
  skip "RTE: $DATA/glue/RTE not found (set LLMPI_SHARED_DATA)"
elif [ ! -f "$MINILM/tokenizer.json" ]; then
  skip "RTE: $MINILM not found (run make pretrained)"
else
  "$B/llmpi-prep" glue --task rte --data-dir "$DATA/glue/RTE" --tokenizer "hf:$MINILM/tokenizer.json" \
    --max-seq-len 128 --out "$tmp/rte" >"$tmp/prep.out" 2>&1
  check "RTE prep: exit 0" "[ $? = 0 ]"
  check "RTE prep: 2490 train and 277 dev examples" \
    "grep -q 'train:   2490 examples' '$tmp/prep.out' && grep -q 'dev:      277 examples' '$tmp/prep.out'"
  check "RTE prep: the manifest names both files" \
    "grep -q train.h5 '$tmp/rte/manifest.json' && grep -q dev.h5 '$tmp/rte/manifest.json'"
  cat >"$tmp/run.json" <<JSON
{"model": {"family": "bert", "num_labels": 2, "seq_len": 128},
 "data": {"train": "$tmp/rte/train.h5", "val": "$tmp/rte/dev.h5"},
 "train": {"steps": 3, "global_batch": 4, "lr": 5e-5, "log_every": 1, "eval_every": 3, "eval_batches": 2},
 "checkpoint": {"every": 0}, "runtime": {"trace_steps": 0}, "run": {"dir": "$tmp/run"}}
JSON
  timeout 240 mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$MINILM" >"$tmp/train.out" 2>&1
  check "2-rank fine-tune of all-MiniLM-L6-v2 on it: exit 0" "[ $? = 0 ]"
  check "... the model is MiniLM with 2 labels" "grep -q 'model bert: 6 layers, 12 heads, d_model 384.*2 labels' '$tmp/train.out'"
  check "... eval.jsonl reports accuracy" "grep -q '\"accuracy\"' '$tmp/run/eval.jsonl'"
  [ $status = 0 ] || { cat "$tmp/prep.out" "$tmp/train.out"; }
fi
exit $status
