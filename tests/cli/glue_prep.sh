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

# A data set of two classification splits, switched as one unit when it is remade: killed at any
# step, the directory holds the old pair or the new one (each file what the manifest says), and a
# bert run trains on it by the names train.h5 / dev.h5 whatever its files are called.
mkdir -p "$tmp/v1" "$tmp/v2"
printf 'index\tsentence1\tsentence2\tlabel\n0\tA cat sat.\tA cat.\tentailment\n1\tA dog ran.\tA cow.\tnot_entailment\n' >"$tmp/v1/train.tsv"
cp "$tmp/v1/train.tsv" "$tmp/v1/dev.tsv"
printf 'index\tsentence1\tsentence2\tlabel\n0\tThe dog.\tA dog.\tentailment\n1\tThe cow.\tA bird.\tnot_entailment\n2\tA hat.\tA hat.\tentailment\n' >"$tmp/v2/train.tsv"
cp "$tmp/v2/train.tsv" "$tmp/v2/dev.tsv"
gprep() { "$B/llmpi-prep" glue --task rte --tokenizer "hf:$TOK" --max-seq-len 16 "$@"; }
hashes() { grep -o '"content_fnv1a64": "[0-9a-f]*"' "$1/manifest.json" | tr '\n' ' '; }
gprep --data-dir "$tmp/v1" --out "$tmp/old" >/dev/null 2>&1 && gprep --data-dir "$tmp/v2" --out "$tmp/new" >/dev/null 2>&1
check "glue writes a version 2 manifest of two classification splits" \
  "grep -q '\"version\": 2' '$tmp/old/manifest.json' && [ \$(grep -c '\"kind\": \"classification\"' '$tmp/old/manifest.json') = 2 ]"
old=$(hashes "$tmp/old") new=$(hashes "$tmp/new")
cat >"$tmp/tiny.json" <<JSON
{"model": {"family": "bert", "num_labels": 2, "seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 32},
 "data": {"train": "$tmp/k/train.h5", "val": "$tmp/k/dev.h5"},
 "train": {"steps": 1, "global_batch": 2, "log_every": 1, "eval_every": 1, "eval_batches": 1},
 "checkpoint": {"every": 0}, "runtime": {"trace_steps": 0}}
JSON
for point in after-train after-dev after-switch; do
  rm -rf "$tmp/k" "$tmp/krun" && cp -r "$tmp/old" "$tmp/k"
  rc=$( { LLMPI_PREP_TEST_CRASH=$point "$B/llmpi-prep" glue --task rte --tokenizer "hf:$TOK" --max-seq-len 16 \
          --data-dir "$tmp/v2" --out "$tmp/k" >/dev/null 2>&1; echo $?; } 2>/dev/null )
  want=$old; [ $point = after-switch ] && want=$new
  check "glue killed $point (exit $rc): the $([ "$want" = "$old" ] && echo old || echo new) pair, and bert trains on it" \
    "[ $rc = 137 ] && [ '$(hashes "$tmp/k")' = '$want' ] && timeout $((60 * TIME_SCALE)) '$B/llmpi-train' --config '$tmp/tiny.json' --set run.dir='$tmp/krun' >'$tmp/k.out' 2>&1"
done
gprep --data-dir "$tmp/v2" --out "$tmp/k" >/dev/null 2>"$tmp/k.err"
check "... a rerun removes what the killed run left and writes generation 3" \
  "[ $? = 0 ] && grep -q 'left by an interrupted llmpi-prep run' '$tmp/k.err' && [ \"\$(ls '$tmp/k' | tr '\n' ' ')\" = 'dev.g3.h5 manifest.json train.g3.h5 ' ]"
"$B/llmpi-prep" inspect "$tmp/k" >"$tmp/insp.out" 2>&1
check "inspect lists both classification splits against the manifest" \
  "[ $? = 0 ] && grep -q 'dev of .*classification, 3 examples of 16 tokens, 2 labels' '$tmp/insp.out' && grep -q 'all 2 files of 2 splits checked against the manifest: 6 examples' '$tmp/insp.out'"
cp "$tmp/old/train.h5" "$tmp/k/dev.g3.h5"
timeout $((60 * TIME_SCALE)) "$B/llmpi-train" --config "$tmp/tiny.json" --set run.dir="$tmp/krun2" >"$tmp/k.out" 2>&1
check "a file that is not the one the manifest names is refused, naming both" \
  "[ $? != 0 ] && grep -q \"dev.g3.h5' is not the file that '$tmp/k/manifest.json' names\" '$tmp/k.out'"

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
  timeout $((240 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$MINILM" >"$tmp/train.out" 2>&1
  check "2-rank fine-tune of all-MiniLM-L6-v2 on it: exit 0" "[ $? = 0 ]"
  check "... the model is MiniLM with 2 labels" "grep -q 'model bert: 6 layers, 12 heads, d_model 384.*2 labels' '$tmp/train.out'"
  check "... eval.jsonl reports accuracy" "grep -q '\"accuracy\"' '$tmp/run/eval.jsonl'"
  [ $status = 0 ] || { cat "$tmp/prep.out" "$tmp/train.out"; }
fi
exit $status
