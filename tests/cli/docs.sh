# The documentation: its links resolve inside the repository (tools/check_docs.sh, shown to fail on
# each kind of bad link in a scratch repository), and docs/CONFIG.md's key table is what
# `llmpi-train --help-keys-markdown` prints, so it agrees with --help on every key and default;
# the example configurations under examples/ are read without error.
source tests/cli/lib.bash
TRAIN=$B/llmpi-train
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

out=$(bash tools/check_docs.sh 2>&1)
check "README.md and docs/*.md: every relative link names a tracked file and an existing heading" "[ -z \"\$out\" ]" ||
  echo "$out"

# The checker fails on each kind of bad link, in a scratch repository.
mkdir -p "$tmp/repo/docs" && cd "$tmp/repo" && git init -q . &&
  printf '# Guide\n\n## Sync methods, in bf16 (ZeRO-1)\n\n## Sync methods, in bf16 (ZeRO-1)\n' >docs/GUIDE.md &&
  printf 'x\n' >ignored.txt && printf 'ignored.txt\n' >.gitignore &&
  printf '# R\n[g](docs/GUIDE.md#sync-methods-in-bf16-zero-1-1) [s](#r) [w](https://example.org/x)\n`[c](nowhere.md)`\n```\n[c](nowhere.md)\n```\n' >README.md &&
  git add README.md docs/GUIDE.md .gitignore && cd - >/dev/null
bash tools/check_docs.sh "$tmp/repo" >"$tmp/good" 2>&1
check "a scratch repository with good links, a repeated heading's anchor and links in code passes" "[ \$? = 0 ] && [ ! -s '$tmp/good' ]" || cat "$tmp/good"
plant() {  # plant WHAT LINK MESSAGE: README.md with one bad link fails naming it
  cp "$tmp/repo/README.md" "$tmp/README.good"
  echo "[bad]($2)" >>"$tmp/repo/README.md"
  bash tools/check_docs.sh "$tmp/repo" >"$tmp/bad" 2>&1
  local rc=$?; printf '%s\n' "$3" >"$tmp/expected"
  check "a planted link to $1 fails: $3" "[ $rc = 1 ] && grep -qFf '$tmp/expected' '$tmp/bad'" || cat "$tmp/bad"
  cp "$tmp/README.good" "$tmp/repo/README.md"
}
plant "a missing file" "docs/MISSING.md" "'docs/MISSING.md' is not a file in the repository"
plant "a missing anchor" "docs/GUIDE.md#sync-methods" "has no heading '#sync-methods'"
plant "a missing anchor in the same file" "#nowhere" "has no heading '#nowhere'"
plant "a file outside the repository" "../shared/data/x.txt" "leaves the repository"
plant "an ignored file" "ignored.txt" "'ignored.txt' is not a file in the repository"

# docs/CONFIG.md's table is the program's, and every key has a description.
"$TRAIN" --help-keys-markdown >"$tmp/keys.md"
check "--help-keys-markdown: exit 0, a description for every key" "[ \$? = 0 ] && grep -q '^| .train.global_batch. ' '$tmp/keys.md' && ! grep -q 'no description' '$tmp/keys.md'"
sed -n '/^<!-- BEGIN generated/,/^<!-- END generated/p' docs/CONFIG.md | sed '1d;$d' >"$tmp/committed.md"
diff -u "$tmp/committed.md" "$tmp/keys.md" >"$tmp/diff"
check "docs/CONFIG.md's key table equals llmpi-train --help-keys-markdown (regenerate: tools/gen_config_doc.sh)" "[ \$? = 0 ]" ||
  head -40 "$tmp/diff"
timeout $((60 * TIME_SCALE)) "$TRAIN" --help >"$tmp/help" 2>&1
disagree=$(grep -oP '^  [a-z_]+\.[a-z_0-9]+ +default \S+' "$tmp/help" | while read -r key _ def; do
  if [[ $key == model.* ]]; then grep -qF "| \`$key\` |" docs/CONFIG.md || echo "$key"
  else grep -qF "| \`$key\` | \`$def\` |" docs/CONFIG.md || echo "$key=$def"; fi
done)
check "every key and default --help lists is in docs/CONFIG.md" "[ -z \"\$disagree\" ] && [ \$(grep -c '^  [a-z_]*\.[a-z_0-9]* *default' '$tmp/help') -gt 50 ]" ||
  echo "not in docs/CONFIG.md: $disagree"

# The configurations the guides tell users to copy are read without error (every key real).
for ex in examples/*.json; do
  out=$(timeout $((60 * TIME_SCALE)) "$B/llmpi-plan" --config "$ex" --world 2 --vocab 50257 2>&1)
  check "$ex: llmpi-plan reads it (every key is one llmpi-train knows)" "[ \$? = 0 ]" || echo "$out" | tail -3
done

# The documentation describes the program and its users' machines, not how it is developed.
words=$(grep -niE 'lent machine|lent to this|borrowed|dev VM|development VM|this project is developed|farm-|helper session|desk review|the course|issue #?[0-9]+' \
  README.md docs/*.md jobs/README.md tools/cuda_cpu_sim/README.md kernels/README.md)
check "the docs say nothing about how or where llmpi is developed (nor its tracker's issues)" "[ -z \"\$words\" ]" || echo "$words"
exit $status
