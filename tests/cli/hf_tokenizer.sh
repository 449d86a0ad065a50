#!/usr/bin/env bash
# llmpi-prep with the Hugging Face tokenizers through the real program: hf:tokenizer.json (the
# committed fixture tokenizers) makes token files whose attributes name the tokenizer and its
# end-of-text id, inspect decodes them back to the text, --allow-special decides whether a
# literal </s> is the special token; wordpiece:vocab.txt (when ../shared/data has BERT's) with
# --lowercase; bad tokenizer arguments are one clear error with exit 1.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
PREP="$B/llmpi-prep"
FX=tests/fixtures/hf_tokenizers
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

expect_error() {
  local name=$1 needle=$2; shift 2
  timeout $((60 * TIME_SCALE)) "$PREP" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local n; n=$(grep -c 'llmpi-prep: error' "$tmp/err")
  if [ $rc != 1 ] || [ "$n" != 1 ] || ! grep -qF -- "$needle" "$tmp/err"; then
    echo "FAIL $name: exit $rc, expected one error line with '$needle':"; cat "$tmp/err"; status=1
  else echo "ok   $name: $(grep 'llmpi-prep: error' "$tmp/err")"; fi
}

# Documents: blank-line separated, one holding a literal </s>.
{
  for i in $(seq 1 40); do echo "Story $i: the little fox saw a café by the river."; echo; done
  echo "Before </s> after"; echo
} > "$tmp/docs.txt"

tok="hf:$FX/llama_bpe/tokenizer.json"
timeout $((60 * TIME_SCALE)) "$PREP" --tokenizer "$tok" --input "$tmp/docs.txt" --out "$tmp/ll" --val-fraction 0.1 --seed 7 \
  >"$tmp/prep.out" 2>&1
check "prep hf:llama_bpe exits 0" "[ $? = 0 ]"
check "summary names the tokenizer and </s> as end-of-text" \
  "grep -q 'tokenizer hf:fnv1a64=[0-9a-f]\{16\} (vocab 1756, eot 2)' '$tmp/prep.out'"
timeout $((60 * TIME_SCALE)) "$PREP" inspect "$tmp/ll/train.h5" --show 20 --tokenizer "$tok" >"$tmp/insp.out" 2>&1
check "inspect with --tokenizer decodes the text" "grep -q 'little fox saw a café' '$tmp/insp.out'"
check "inspect records the tokenizer" "grep -q '^tokenizer:   hf:fnv1a64=' '$tmp/insp.out'"
timeout $((60 * TIME_SCALE)) "$PREP" inspect "$tmp/ll/train.h5" --show 5 >"$tmp/insp2.out" 2>&1
check "inspect without --tokenizer says how to decode" "grep -qF 'give --tokenizer hf:PATH' '$tmp/insp2.out'"

# </s> is ordinary text unless --allow-special: count end-of-text ids over both files.
eots() {
  local total=0 n
  for f in train val; do
    n=$("$PREP" inspect "$1/$f.h5" --show 0 | sed -n 's/.*(\([0-9,]*\) of them end-of-text).*/\1/p' | tr -d ,)
    total=$((total + n))
  done
  echo $total
}
timeout $((60 * TIME_SCALE)) "$PREP" --tokenizer "$tok" --input "$tmp/docs.txt" --out "$tmp/sp" --val-fraction 0.1 --seed 7 \
  --allow-special >/dev/null 2>&1
check "without --allow-special: only the 39 separators are end-of-text" "[ $(eots "$tmp/ll") = 39 ]"
check "with --allow-special: the literal </s> is one more" "[ $(eots "$tmp/sp") = 40 ]"

if [ -f "$DATA/bert/uncased/vocab.txt" ]; then
  timeout $((60 * TIME_SCALE)) "$PREP" --tokenizer "wordpiece:$DATA/bert/uncased/vocab.txt" --lowercase --input "$tmp/docs.txt" \
    --out "$tmp/wp" --val-fraction 0.1 >"$tmp/wp.out" 2>&1
  check "prep wordpiece: --lowercase exits 0" "[ $? = 0 ]"
  check "wordpiece summary: vocab 30522, [SEP] = 102" \
    "grep -q 'tokenizer wordpiece:lowercase:fnv1a64=[0-9a-f]\{16\} (vocab 30522, eot 102)' '$tmp/wp.out'"
  timeout $((60 * TIME_SCALE)) "$PREP" inspect "$tmp/wp/train.h5" --show 12 --tokenizer "wordpiece:$DATA/bert/uncased/vocab.txt" \
    --lowercase >"$tmp/wpi.out" 2>&1
  check "wordpiece inspect decodes lower-cased, accents stripped" "grep -q 'story 1 : the little fox saw a cafe' '$tmp/wpi.out'"
else
  echo "skip wordpiece: $DATA/bert/uncased/vocab.txt not found (set LLMPI_SHARED_DATA)"
fi

printf '{"model": {"type": "Unigram", "vocab": []}}' > "$tmp/unigram.json"
expect_error "unsupported model type is named" "model type 'Unigram' is not supported" \
  --tokenizer "hf:$tmp/unigram.json" --input "$tmp/docs.txt" --out "$tmp/x"
expect_error "missing tokenizer.json" "cannot open tokenizer.json" \
  --tokenizer "hf:$tmp/none.json" --input "$tmp/docs.txt" --out "$tmp/x"
expect_error "unknown tokenizer kind" "unknown tokenizer 'sentencepiece:x'" \
  --tokenizer "sentencepiece:x" --input "$tmp/docs.txt" --out "$tmp/x"
expect_error "--lowercase with a tokenizer.json" "--lowercase is for --tokenizer wordpiece" \
  --tokenizer "$tok" --lowercase --input "$tmp/docs.txt" --out "$tmp/x"
check "no output directory left by the errors" "[ ! -e '$tmp/x' ]"
exit $status
