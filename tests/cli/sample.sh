#!/usr/bin/env bash
# llmpi-sample through the real programs, without mpiexec: a tiny byte-level gpt2 and llama run
# trained for a few steps, then sampled from its checkpoint (file, checkpoints dir, DIR/latest,
# run dir); greedy = top-k 1 = no KV cache; a seed reproduces; the Hugging Face fixture models
# give transformers' greedy tokens; bad input is one clear error with exit 1, and so are weights
# or logits that are not finite (greedy or sampled), never tokens chosen from NaN.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
SAMPLE="$B/llmpi-sample"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# expect_error NAME NEEDLE ARGS... : exit 1 and NEEDLE on the one error line of stderr.
expect_error() {
  local name=$1 needle=$2; shift 2
  timeout $((60 * TIME_SCALE)) "$SAMPLE" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local n; n=$(grep -c 'llmpi-sample: error' "$tmp/err")
  if [ $rc != 1 ] || [ "$n" != 1 ] || ! grep -qF -- "$needle" "$tmp/err"; then
    echo "FAIL $name: exit $rc, expected one error line with '$needle':"; cat "$tmp/err"; status=1
  else echo "ok   $name: $(grep 'llmpi-sample: error' "$tmp/err")"; fi
}

"$B/llmpi-demo-corpus" --out "$tmp/c.txt" --seed 3 --megabytes 0.2 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/c.txt" --out "$tmp/d" --val-fraction 0.1 >/dev/null 2>&1
for fam in gpt2 llama; do
  extra=(); [ $fam = llama ] && extra=(--set model.n_kv_head=2)
  timeout $((240 * TIME_SCALE)) mpiexec -n 1 "$B/llmpi-train" --config data/demo.json --set model.family=$fam \
    --set data.train="$tmp/d/train.h5" --set data.val="" --set run.dir="$tmp/run-$fam" --set train.steps=30 \
    --set train.log_every=30 --set model.n_layer=2 --set model.d_model=32 --set model.seq_len=48 --set checkpoint.every=30 \
    --set train.global_batch=8 "${extra[@]}" >"$tmp/train-$fam.out" 2>&1
  check "$fam: tiny training run: exit 0" "[ $? = 0 ]"
done
ck=$(ls "$tmp"/run-gpt2/checkpoints/step-*.h5 | tail -1)

# Text through the run's byte tokenizer; the prompt comes first, then the new text.
"$SAMPLE" --init-from "$tmp/run-gpt2/checkpoints/latest" --prompt "Once upon" --max-new-tokens 20 --seed 5 \
  >"$tmp/a.out" 2>"$tmp/a.err"
check "sample from checkpoints/latest: exit 0" "[ $? = 0 ]"
check "output starts with the prompt" "head -c 9 '$tmp/a.out' | grep -qx 'Once upon'"
check "header names the checkpoint on stderr" "grep -q 'step-.*gpt2, 2 layers' '$tmp/a.err'"
"$SAMPLE" --init-from "$tmp/run-gpt2" --prompt "Once upon" --max-new-tokens 20 --seed 5 >"$tmp/b.out" 2>/dev/null
check "same seed, run dir: the same text" "cmp -s '$tmp/a.out' '$tmp/b.out'"
"$SAMPLE" --init-from "$ck" --prompt "Once upon" --max-new-tokens 20 --seed 6 --ids >"$tmp/c.out" 2>/dev/null
"$SAMPLE" --init-from "$ck" --prompt "Once upon" --max-new-tokens 20 --seed 5 --ids >"$tmp/c5.out" 2>/dev/null
check "20 new tokens at most" "[ \$(wc -w <'$tmp/c5.out') -le 20 ]"
check "another seed: other tokens" "! cmp -s '$tmp/c.out' '$tmp/c5.out'"
# The byte tokenizer's text is the bytes of the ids, without the end-of-text id (256) that stops it.
check "--ids: the same tokens as the text" "[ \"\$(head -c -1 '$tmp/a.out' | tail -c +10 | od -An -tu1 | xargs)\" = \"\$(xargs <'$tmp/c5.out' | sed 's/ *256\$//')\" ]"

# Greedy, top-k 1 and the uncached path agree, for gpt2 and llama.
for fam in gpt2 llama; do
  r="$tmp/run-$fam/checkpoints"
  "$SAMPLE" --init-from "$r" --prompt "The " --greedy --ids --max-new-tokens 30 >"$tmp/g.out" 2>/dev/null
  "$SAMPLE" --init-from "$r" --prompt "The " --top-k 1 --temperature 1.5 --ids --max-new-tokens 30 >"$tmp/k.out" 2>/dev/null
  "$SAMPLE" --init-from "$r" --prompt "The " --greedy --ids --max-new-tokens 30 --no-kv-cache >"$tmp/n.out" 2>/dev/null
  check "$fam: greedy gives ids" "[ \$(wc -w <'$tmp/g.out') -ge 1 ]"
  check "$fam: greedy = top-k 1" "cmp -s '$tmp/g.out' '$tmp/k.out'"
  check "$fam: KV cache = full forward" "cmp -s '$tmp/g.out' '$tmp/n.out'"
done
"$SAMPLE" --init-from "$ck" --prompt "The " --ids --max-new-tokens 200 --eot-id -1 >"$tmp/ctx.out" 2>"$tmp/ctx.err"
check "stops at the context (48 = 4 prompt + 44 new)" "[ \$(wc -w <'$tmp/ctx.out') = 44 ] && grep -q 'context of 48' '$tmp/ctx.err'"

# Hugging Face fixtures: transformers' greedy tokens (tests/fixtures/hf/*/fixture.json, first generation).
for fam in gpt2 llama; do
  gen=$(tr -d ' \n' <tests/fixtures/hf/$fam/fixture.json | grep -oP '"prompt":\[[0-9,]+\],"greedy_20":\[[0-9,]+\]' | head -1)
  prompt=$(echo "$gen" | grep -oP '"prompt":\[\K[0-9,]+')
  want=$(echo "$gen" | grep -oP '"greedy_20":\[\K[0-9,]+' | tr ',' ' ')
  got=$("$SAMPLE" --init-from tests/fixtures/hf/$fam --prompt-ids "$prompt" --greedy --ids --max-new-tokens 20 2>/dev/null)
  check "hf $fam: transformers' greedy tokens ($want)" "[ -n '$prompt' ] && [ '$got' = '$want' ]"
done

# An hf: tokenizer (byte fallback + metaspace): prepared, trained, sampled as text.
TOKJ=tests/fixtures/hf_tokenizers/llama_bpe/tokenizer.json
"$B/llmpi-prep" --tokenizer "hf:$TOKJ" --input "$tmp/c.txt" --out "$tmp/dh" --val-fraction 0.1 >/dev/null 2>&1
timeout $((240 * TIME_SCALE)) mpiexec -n 1 "$B/llmpi-train" --config data/demo.json --set model.family=llama \
  --set data.train="$tmp/dh/train.h5" --set data.val="" --set run.dir="$tmp/run-hf" --set train.steps=10 \
  --set train.log_every=10 --set model.n_layer=1 --set model.d_model=32 --set model.seq_len=32 \
  --set train.global_batch=4 --set checkpoint.every=10 >"$tmp/train-hf.out" 2>&1
check "llama with an hf: tokenizer: tiny training run: exit 0" "[ $? = 0 ]"
"$SAMPLE" --init-from "$tmp/run-hf" --tokenizer "hf:$TOKJ" --prompt "Once upon a time" --max-new-tokens 10 \
  --seed 1 >"$tmp/h.out" 2>"$tmp/h.err"
check "hf: tokenizer: text output starts with the prompt" "[ $? = 0 ] && grep -q '^Once upon a time' '$tmp/h.out'"
expect_error hf-tokenizer-needed "--tokenizer hf:PATH" --init-from "$tmp/run-hf" --prompt "x"

# Errors.
expect_error bert-refused "bert model" --init-from tests/fixtures/hf/bert --prompt-ids 1,2 --ids
long=$(head -c 60 /dev/zero | tr '\0' 'a')
expect_error prompt-too-long "context is 48 positions" --init-from "$ck" --prompt "$long"
expect_error top-p "--top-p must be in (0, 1]" --init-from "$ck" --prompt "x" --top-p 1.5
expect_error temperature "--temperature must be" --init-from "$ck" --prompt "x" --temperature -1
expect_error top-k "--top-k must be >= 0" --init-from "$ck" --prompt "x" --top-k -3
expect_error unknown-flag "--bogus" --init-from "$ck" --bogus
expect_error missing-init "--init-from is required" --prompt "x"
expect_error missing-path "does not exist" --init-from "$tmp/nope.h5" --prompt "x"
expect_error empty-dir "neither step-*.h5" --init-from "$tmp/d" --prompt "x"
expect_error bad-ids "'1x' is not a token id" --init-from "$ck" --prompt-ids 1x
expect_error id-range "outside the model's vocabulary" --init-from "$ck" --prompt-ids 5,300 --ids
expect_error both-prompts "not both" --init-from "$ck" --prompt "x" --prompt-ids 1
expect_error no-tokenizer "no tokenizer is known" --init-from tests/fixtures/hf/gpt2 --prompt "x"
expect_error tokenizer-mismatch "is not the one the run's data was made with" --init-from "$tmp/run-hf" \
  --prompt "x" --tokenizer hf:tests/fixtures/hf_tokenizers/metaspace_bpe/tokenizer.json
expect_error max-new-tokens "--max-new-tokens must be >= 0 (most tokens to generate), got -1" --init-from "$ck" --prompt "x" --max-new-tokens -1
expect_error threads "--threads must be >= 0 (CPU threads, 0 = OMP_NUM_THREADS or every core), got -2" --init-from "$ck" --prompt "x" --threads -2
expect_error eot-id "--eot-id must be >= -1 (the token id that stops generation, -1 = never stop), got -5" --init-from "$ck" --prompt "x" --eot-id -5
expect_error eot-id-vocab "--eot-id 300 is outside the model's vocabulary: give an id in [0, 257)" --init-from "$ck" --prompt "x" --eot-id 300
expect_error seed "--seed must be an integer in [0, 18446744073709551615] (the seed of the draws), got '-1'" --init-from "$ck" --prompt "x" --seed -1
expect_error seed-range "got '18446744073709551616'" --init-from "$ck" --prompt "x" --seed 18446744073709551616

# Weights that are not finite (4 NaN in layer 0's c_attn.bias), and finite weights whose logits are
# not (ln_f.weight all at the largest float): refused by name, greedy and sampled.
mkdir -p "$tmp/nan" "$tmp/huge"
cp tests/fixtures/hf/gpt2/config.json tests/fixtures/hf/gpt2/model.safetensors "$tmp/nan/"
cp tests/fixtures/hf/gpt2/config.json tests/fixtures/hf/gpt2/model.safetensors "$tmp/huge/"
set_floats "$tmp/nan/model.safetensors" transformer.h.0.attn.c_attn.bias 10 4 ffffffff &&
  set_floats "$tmp/huge/model.safetensors" transformer.ln_f.weight 0 32 ffff7f7f
check "fixture copies with NaN weights and with overflowing weights made" "[ $? = 0 ]"
for mode in --greedy "--temperature 0.8"; do
  expect_error "NaN weights ($mode)" \
    "$tmp/nan: the model's weights are not finite: tensor 'h.0.attn.c_attn.bias' holds 4 non-finite values of 96 (the first, nan, at element 10)" \
    --init-from "$tmp/nan" --prompt-ids 1,2 --ids $mode
  check "... no token printed" "[ ! -s '$tmp/out' ]"
  expect_error "overflowing logits ($mode)" "the logits for new token 1 (position 2) are not finite" \
    --init-from "$tmp/huge" --prompt-ids 1,2 --ids $mode
  check "... no token printed" "[ -z \"\$(tr -d ' \\n' <'$tmp/out')\" ]"
done

"$SAMPLE" --help >"$tmp/help" 2>&1
check "--help: exit 0 and documents the options" "grep -q -- '--top-p' '$tmp/help' && grep -q -- '--no-kv-cache' '$tmp/help'"
exit $status
