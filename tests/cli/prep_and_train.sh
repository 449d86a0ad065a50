#!/usr/bin/env bash
# End to end through the real programs: demo corpus -> llmpi-prep (text and JSONL) -> inspect ->
# mpiexec -n 2 llmpi-train for a few steps; and llmpi-prep's errors leave no output behind.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# Demo corpus: deterministic by seed.
"$B/llmpi-demo-corpus" --out "$tmp/a.txt" --seed 7 --megabytes 0.3 >/dev/null
"$B/llmpi-demo-corpus" --out "$tmp/b.txt" --seed 7 --megabytes 0.3 >/dev/null
"$B/llmpi-demo-corpus" --out "$tmp/c.txt" --seed 8 --megabytes 0.3 >/dev/null
check "demo corpus is the same for the same seed" "cmp -s '$tmp/a.txt' '$tmp/b.txt'"
check "demo corpus differs by seed" "! cmp -s '$tmp/a.txt' '$tmp/c.txt'"
check "demo corpus has blank-line separated documents" "[ \$(grep -c '^\$' '$tmp/a.txt') -gt 100 ]"

# Prepare and inspect.
"$B/llmpi-prep" --tokenizer byte --input "$tmp/a.txt" --out "$tmp/d" --val-fraction 0.1 >"$tmp/prep.out" 2>&1
check "llmpi-prep text: exit 0" "[ $? = 0 ]"
check "train.h5 and val.h5 written" "[ -s '$tmp/d/train.h5' ] && [ -s '$tmp/d/val.h5' ]"
"$B/llmpi-prep" inspect "$tmp/d/train.h5" >"$tmp/inspect.out" 2>&1
check "inspect shows format and vocab" "grep -q 'llmpi-tokens' '$tmp/inspect.out' && grep -q 'vocab_size: *257' '$tmp/inspect.out'"
check "h5dump reads the file (standard HDF5)" "h5dump -A '$tmp/d/train.h5' | grep -q 'llmpi-tokens'"

printf '{"text": "Once upon a time."}\n{"text": "The end.\\nReally."}\n{"text": "A third one."}\n' >"$tmp/x.jsonl"
"$B/llmpi-prep" --tokenizer byte --input "$tmp/x.jsonl" --out "$tmp/j" --val-fraction 0.34 >/dev/null 2>&1
check "llmpi-prep jsonl: exit 0" "[ $? = 0 ] && [ -s '$tmp/j/train.h5' ]"
printf '{"text": "ok"}\n{"txt": "bad"}\n' >"$tmp/bad.jsonl"
"$B/llmpi-prep" --tokenizer byte --input "$tmp/bad.jsonl" --out "$tmp/jb" >/dev/null 2>"$tmp/err"
check "bad JSONL line: exit 1 naming file:line" "[ $? = 1 ] && grep -q 'bad.jsonl:2' '$tmp/err'"
check "bad JSONL: no output file left" "[ ! -e '$tmp/jb/train.h5' ] && [ -z \"\$(ls -A '$tmp/jb' 2>/dev/null)\" ]"
"$B/llmpi-prep" --tokenizer byte --input "$tmp/none.txt" --out "$tmp/n" >/dev/null 2>"$tmp/err"
check "missing input: exit 1 with one error line" "[ $? = 1 ] && [ \$(grep -c 'llmpi-prep: error' '$tmp/err') = 1 ]"
check "missing input: no output file" "[ ! -e '$tmp/n/train.h5' ]"

# Train for a few steps on 2 ranks.
timeout $((240 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config data/demo.json --set data.train="$tmp/d/train.h5" \
  --set data.val="$tmp/d/val.h5" --set run.dir="$tmp/run" --set train.steps=40 --set train.eval_every=20 \
  --set train.log_every=10 --set model.d_model=64 --set model.seq_len=64 --set train.eval_batches=2 >"$tmp/train.out" 2>&1
rc=$?
check "2-rank training: exit 0" "[ $rc = 0 ]"
check "progress lines printed" "[ \$(grep -c '^step ' '$tmp/train.out') -ge 4 ]"
check "metrics.jsonl has the first five steps and one line per log interval (0-4, 10, 20, 30, 39)" "[ \$(wc -l <'$tmp/run/metrics.jsonl') = 9 ]"
check "eval.jsonl has steps 0, 20, 40" "[ \$(wc -l <'$tmp/run/eval.jsonl') = 3 ]"
first=$(head -1 "$tmp/run/eval.jsonl" | grep -oP '"val_loss":\K[0-9.]+')
last=$(tail -1 "$tmp/run/eval.jsonl" | grep -oP '"val_loss":\K[0-9.]+')
check "validation loss falls ($first -> $last)" "awk 'BEGIN{exit !($last < $first - 0.5)}'"
check "resolved config written" "grep -q '\"vocab_size\": 257' '$tmp/run/config.json'"
[ $status = 0 ] || cat "$tmp/train.out"
exit $status
