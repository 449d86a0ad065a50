#!/usr/bin/env bash
# Hugging Face weights through the real programs: llmpi-train --init-from a fixture model
# (tests/fixtures/hf/*, tiny models saved by transformers) on 2 ranks (as replicas, and as one
# tensor-parallel group), llmpi-export of the run's checkpoint, and the errors of both; where llmpi-export may write (never a run directory, nothing
# it did not write unless --overwrite, which keeps it) and its refusal of weights that are not finite.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
FX=tests/fixtures/hf

"$B/llmpi-demo-corpus" --out "$tmp/a.txt" --seed 3 --megabytes 0.1 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/a.txt" --out "$tmp/d" >/dev/null 2>&1
cat >"$tmp/run.json" <<JSON
{"data": {"train": "$tmp/d/train.h5"}, "model": {"seq_len": 32},
 "train": {"steps": 2, "global_batch": 4, "lr": 0.0, "weight_decay": 0.0, "log_every": 1, "eval_every": 0},
 "checkpoint": {"every": 2}, "runtime": {"trace_steps": 0}, "run": {"dir": "$tmp/run"}}
JSON

for fam in gpt2 llama; do
  # lr 0: the checkpoint after two steps holds exactly the imported parameters.
  timeout $((240 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from $FX/$fam \
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

# Tensor parallelism: each rank takes its shards of the imported tensors, and the checkpoint
# gathers them whole again (lr 0: the same bytes as the direct export).
for fam in gpt2 llama; do
  timeout $((240 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from $FX/$fam --set parallel.tp=2 \
    --set run.dir="$tmp/run-tp-$fam" >"$tmp/train-tp-$fam.out" 2>&1 &&
    "$B/llmpi-export" --checkpoint "$tmp/run-tp-$fam" --out "$tmp/exp-tp-$fam" >/dev/null 2>&1
  check "$fam: --init-from with parallel.tp=2, train (lr 0), export = import+export, byte for byte" \
    "[ $? = 0 ] && grep -q 'tensor parallelism: 2 ranks per layer' '$tmp/train-tp-$fam.out' &&
     cmp -s '$tmp/exp-tp-$fam/model.safetensors' '$tmp/direct-$fam/model.safetensors'"
done

# An export trains again (its config.json and tensors are what --init-from reads).
timeout $((240 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/exp-gpt2" \
  --set run.dir="$tmp/run-again" >"$tmp/again.out" 2>&1
check "an llmpi export is a valid --init-from directory" "[ $? = 0 ]"

# Errors: one line, exit 2 on every rank.
timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from $FX/llama --set model.n_layer=3 \
  --set run.dir="$tmp/run-x" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "a model key that contradicts config.json: exit 2 naming both" \
  "[ $rc = 2 ] && grep -q \"'model.n_layer' is set to 3 but '$FX/llama/config.json' has 2\" '$tmp/err'"
check "... said once" "[ \$(grep -c 'llmpi-train: error' '$tmp/err') = 1 ]"
timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/nowhere" \
  --set run.dir="$tmp/run-y" >"$tmp/out" 2>"$tmp/err"
check "--init-from a missing directory: exit 2 naming config.json" "[ $? = 2 ] && grep -q 'nowhere/config.json' '$tmp/err'"
mkdir -p "$tmp/broken" && cp $FX/gpt2/config.json "$tmp/broken/" && head -c 1000 $FX/gpt2/model.safetensors >"$tmp/broken/model.safetensors"
timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/broken" \
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
# ---- export destinations
EXPORT="$B/llmpi-export"
md5s() { (cd "$1" && md5sum -- *); }
# A directory that holds another model: a llama config.json, model.safetensors and tokenizer.json.
mkdir -p "$tmp/other" && cp $FX/llama/config.json $FX/llama/model.safetensors tests/fixtures/hf_tokenizers/llama_bpe/tokenizer.json "$tmp/other/"
before=$(md5s "$tmp/other")
"$EXPORT" --checkpoint "$tmp/run-gpt2" --out "$tmp/other" >/dev/null 2>"$tmp/err"
rc=$?
check "export into a directory holding another model: exit 2, one line naming what it holds and --overwrite" \
  "[ $rc = 2 ] && [ \$(wc -l <'$tmp/err') = 1 ] && grep -qF \"'$tmp/other' is not empty: it holds config.json, model.safetensors, tokenizer.json (a Hugging Face model (config.json of LlamaForCausalLM, model.safetensors), not written by llmpi-export)\" '$tmp/err' && grep -q 'pass --overwrite' '$tmp/err'"
check "... the model there untouched, nothing left beside it" \
  "[ \"\$(md5s '$tmp/other')\" = \"$before\" ] && ! ls -A '$tmp' | grep -q 'tmp-'"
"$EXPORT" --checkpoint "$tmp/run-gpt2" --out "$tmp/other" --overwrite >"$tmp/out" 2>&1
rc=$?
prev=$(ls -d "$tmp"/other.previous-* 2>/dev/null)
check "--overwrite: exit 0, the gpt2 export alone in its place (no llama tokenizer left beside it)" \
  "[ $rc = 0 ] && grep -q GPT2LMHeadModel '$tmp/other/config.json' && [ ! -e '$tmp/other/tokenizer.json' ] && cmp -s '$tmp/other/model.safetensors' '$tmp/exp-gpt2/model.safetensors'"
check "--overwrite: the llama model moved aside whole, where the output says" \
  "[ -n '$prev' ] && [ \"\$(md5s '$prev')\" = \"$before\" ] && grep -qF 'now in $prev' '$tmp/out'"
# Its own earlier export is replaced whole without --overwrite; a file it did not write stops that.
"$EXPORT" --checkpoint "$tmp/run-llama" --out "$tmp/other" >/dev/null 2>&1
check "an earlier export is replaced: exit 0, llama now" \
  "[ $? = 0 ] && grep -q LlamaForCausalLM '$tmp/other/config.json' && [ \$(ls -d '$tmp'/other.previous-* | wc -l) = 1 ]"
echo "my notes" >"$tmp/other/README.md"
"$EXPORT" --checkpoint "$tmp/run-gpt2" --out "$tmp/other" >/dev/null 2>"$tmp/err"
check "... but not once it holds a file the export did not write: exit 2 naming it" \
  "[ $? = 2 ] && grep -qF 'files it did not write: README.md' '$tmp/err' && grep -q LlamaForCausalLM '$tmp/other/config.json'"
# The run directory itself: refused, with or without --overwrite; the run stays usable.
cfg=$(md5sum <"$tmp/run-gpt2/config.json")
for ow in "" --overwrite; do
  "$EXPORT" --checkpoint "$tmp/run-gpt2" --out "$tmp/run-gpt2" $ow >/dev/null 2>"$tmp/err"
  rc=$?
  check "export into its own run directory $ow: exit 2 naming the run" \
    "[ $rc = 2 ] && grep -qF \"'$tmp/run-gpt2' is an llmpi run directory (it holds checkpoints/ (1 step-*.h5)\" '$tmp/err'"
done
check "... the run's config.json untouched" "[ \"\$(md5sum <'$tmp/run-gpt2/config.json')\" = '$cfg' ]"
"$B/llmpi-sample" --init-from "$tmp/run-gpt2" --prompt-ids 1,2 --ids --greedy --max-new-tokens 3 >/dev/null 2>"$tmp/err"
check "... and llmpi-sample --init-from the run still works" "[ $? = 0 ]" || cat "$tmp/err"
# A run directory where a Hugging Face model directory is expected: named as a run.
timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/run-gpt2" \
  --set run.dir="$tmp/run-w" >/dev/null 2>"$tmp/err"
rc=$?
"$EXPORT" --hf-dir "$tmp/run-gpt2" --out "$tmp/from-run" >/dev/null 2>"$tmp/err2"
check "--init-from and --hf-dir given a run directory: exit 2 naming it a run, --resume and llmpi-export" \
  "[ $rc = 2 ] && [ $? = 2 ] && grep -qF \"'$tmp/run-gpt2' is an llmpi run directory (it holds checkpoints/\" '$tmp/err' && grep -q 'resume auto, or export it first with llmpi-export' '$tmp/err' && grep -qF 'is an llmpi run directory' '$tmp/err2'"
# A Hugging Face model directory as run.dir: refused before anything is written, --overwrite too.
mcfg=$(md5sum <"$tmp/exp-gpt2/config.json")
for ow in "" --overwrite; do
  timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config "$tmp/run.json" --init-from "$tmp/exp-gpt2" $ow \
    --set run.dir="$tmp/exp-gpt2" >/dev/null 2>"$tmp/err"
  rc=$?
  check "run.dir holding an exported model $ow: exit 2 naming the model and --init-from" \
    "[ $rc = 2 ] && grep -qF \"run.dir '$tmp/exp-gpt2' holds a Hugging Face model (config.json of GPT2LMHeadModel\" '$tmp/err' && grep -q 'start from this model with --init-from' '$tmp/err'"
done
check "... the model's config.json untouched, no run files beside it" \
  "[ \"\$(md5sum <'$tmp/exp-gpt2/config.json')\" = '$mcfg' ] && [ ! -e '$tmp/exp-gpt2/metrics.jsonl' ] && [ ! -e '$tmp/exp-gpt2/checkpoints' ]"
# --row: in range, and only for a checkpoint.
for args in "--row -1|--row must be >= 0 (a rank of the checkpoint, 0 = the first), got -1" \
            "--row 1|--row 1 is not a row of" "--hf-dir $FX/gpt2 --row 0|it does not apply to --hf-dir"; do
  a=${args%%|*}; want=${args#*|}
  ck_arg=(--checkpoint "$tmp/run-gpt2"); [[ $a == --hf-dir* ]] && ck_arg=()
  "$EXPORT" "${ck_arg[@]}" $a --out "$tmp/rowtest" >/dev/null 2>"$tmp/err"
  check "llmpi-export $a: exit 2, '$want'" "[ $? = 2 ] && grep -qF -- '$want' '$tmp/err' && [ ! -e '$tmp/rowtest' ]"
done

# ---- weights that are not finite: four NaN in the first tensor of the data (c_attn.bias of layer 0)
mkdir -p "$tmp/nan" && cp $FX/gpt2/config.json $FX/gpt2/model.safetensors "$tmp/nan/"
set_floats "$tmp/nan/model.safetensors" transformer.h.0.attn.c_attn.bias 10 4 ffffffff
check "a gpt2 fixture with 4 NaN weights made" "[ $? = 0 ]"
"$EXPORT" --hf-dir "$tmp/nan" --out "$tmp/nan-out" >/dev/null 2>"$tmp/err"
check "export of NaN weights: exit 2 naming the tensor, nothing written" \
  "[ $? = 2 ] && grep -qF \"tensor 'h.0.attn.c_attn.bias' holds 4 non-finite values of 96 (the first, nan, at element 10)\" '$tmp/err' && [ ! -e '$tmp/nan-out' ] && ! ls -A '$tmp' | grep -q 'tmp-'"

[ $status = 0 ] || { cat "$tmp"/train-*.out; cat "$tmp/err"; }
exit $status
