#!/usr/bin/env bash
# llmpi-prep at corpus scale with the real programs (issue 34, and issue 33's llmpi-prep parts):
#   the same data set (manifest: every shard's token count and content hash) from 1, 2 and 4 ranks,
#   from text, JSONL, gzip / zstd and standard input, whatever --split-bytes; training from the
#   sharded directory gives the losses of training from one file of the same tokens, and resumes on
#   it (but not on another data set); inspect verifies a directory; a changed shard is refused; a
#   run killed at any step leaves the old or the new data set, never a mix (and its lock is taken
#   over); a failed run leaves nothing; a second run on the same --out is refused at once, naming the
#   first, and harms neither it nor the data set there; another program's directory needs
#   --overwrite; numeric flags are range-checked, with one error line and exit 1 on every rank.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
PREP="$B/llmpi-prep"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prep() { timeout $((120 * TIME_SCALE)) "$PREP" "$@"; }
mprep() { local n=$1; shift; timeout $((120 * TIME_SCALE)) mpiexec -n "$n" "$PREP" "$@"; }
manifest_hashes() { grep -o '"content_fnv1a64": "[0-9a-f]*"' "$1/manifest.json" | tr '\n' ' '; }

"$B/llmpi-demo-corpus" --out "$tmp/a.txt" --seed 7 --megabytes 0.25 >/dev/null
"$B/llmpi-demo-corpus" --out "$tmp/b.txt" --seed 8 --megabytes 0.1 >/dev/null
# The same documents as JSONL: one {"text": ...} per blank-line separated story.
awk 'BEGIN { RS = "" } { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\n/, "\\n"); print "{\"text\": \"" $0 "\"}" }' \
  "$tmp/b.txt" >"$tmp/b.jsonl"
mkdir "$tmp/in" && cp "$tmp/a.txt" "$tmp/in/1.txt" && gzip -c "$tmp/b.jsonl" >"$tmp/in/2.jsonl.gz"
have_zstd=0
if command -v zstd >/dev/null; then zstd -q -c "$tmp/b.txt" >"$tmp/in/3.txt.zst" && have_zstd=1; fi
common=(--tokenizer byte --val-fraction 0.1 --shard-tokens 20K)

# ---- the same data set on 1, 2 and 4 ranks, and whatever --split-bytes
prep "${common[@]}" --input "$tmp/in/*" --out "$tmp/n1" >"$tmp/n1.out" 2>&1
check "1 rank: exit 0, shards written" "[ $? = 0 ] && [ -f '$tmp/n1/train-00000.h5' ] && [ -f '$tmp/n1/manifest.json' ]" ||
  cat "$tmp/n1.out"
for n in 2 4; do
  mprep $n "${common[@]}" --input "$tmp/in/*" --out "$tmp/n$n" --split-bytes 16K >"$tmp/n$n.out" 2>&1
  check "$n ranks (--split-bytes 16K): exit 0, the 1-rank manifest byte for byte" \
    "[ $? = 0 ] && cmp -s '$tmp/n1/manifest.json' '$tmp/n$n/manifest.json'" || cat "$tmp/n$n.out"
done
check "the 4-rank run divided the text file into ranges and says so" "grep -q '4 ranks' '$tmp/n4.out'"
[ $have_zstd = 1 ] || skip "zstd input: no zstd command here (the unit tests cover zstd)"
check "no work files left" "[ ! -e '$tmp/n4/.llmpi-prep-work' ] && [ -z \"\$(ls '$tmp/n4' | grep -v -E '^(manifest.json|(train|val)(-[0-9]{5})?\.h5)\$')\" ]"

# JSONL and text of the same documents, standard input and a file: the same data set.
prep "${common[@]}" --input "$tmp/b.txt" --out "$tmp/bt" >/dev/null 2>&1
prep "${common[@]}" --input "$tmp/b.jsonl" --out "$tmp/bj" >/dev/null 2>&1
prep "${common[@]}" --input - --out "$tmp/bs" <"$tmp/b.txt" >/dev/null 2>&1
# Under mpiexec a named pipe, which rank 0 reads (MPICH's mpiexec forwards standard input badly).
mkfifo "$tmp/pipe" && { cat "$tmp/b.txt" >"$tmp/pipe" & }
mprep 2 "${common[@]}" --input "$tmp/pipe" --out "$tmp/bp" >/dev/null 2>&1
check "JSONL, text, standard input and a named pipe on 2 ranks, of the same documents: the same data set" \
  "cmp -s '$tmp/bt/manifest.json' '$tmp/bj/manifest.json' && cmp -s '$tmp/bt/manifest.json' '$tmp/bs/manifest.json' && cmp -s '$tmp/bt/manifest.json' '$tmp/bp/manifest.json'"

# ---- inspect verifies a directory; the stream is one file's tokens
prep --tokenizer byte --val-fraction 0.1 --input "$tmp/in/*" --out "$tmp/one" >/dev/null 2>&1
prep inspect "$tmp/n1" --show 0 >"$tmp/insp.out" 2>&1
check "inspect DIR: every file verified" "[ $? = 0 ] && grep -q '^all [0-9]* files of 2 splits verified' '$tmp/insp.out'"
stream=$(grep -m1 -o "stream's tokens hash to fnv1a64 [0-9a-f]*" "$tmp/insp.out" | awk '{print $NF}')
single=$(prep inspect "$tmp/one/train.h5" --show 0 | grep '^content:' | grep -o 'fnv1a64 [0-9a-f]*' | awk '{print $2}')
check "the sharded train split's stream is the single file's tokens ($stream = $single)" "[ -n '$stream' ] && [ '$stream' = '$single' ]"

# ---- training from the shards: the losses of training from the one file (the GEMM engine pinned:
# "auto" is timed at start-up, and two runs on different engines differ in the last bits)
train_losses() {
  rm -rf "$tmp/run"
  timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config data/demo.json --set data.train="$1" --set data.val="$2" \
    --set run.dir="$tmp/run" --set train.steps=6 --set model.d_model=32 --set model.n_layer=1 --set model.seq_len=32 \
    --set train.eval_every=3 --set train.log_every=1 --set runtime.cpu_fp32_gemm=openblas >"$tmp/train.out" 2>&1 || { cat "$tmp/train.out"; return 1; }
  grep -o '"\(val_\)\?loss":[0-9.e+-]*' "$tmp/run/metrics.jsonl" "$tmp/run/eval.jsonl" | sed 's/^[^:]*://' | tr '\n' ' '
}
sharded=$(train_losses "$tmp/n1" "$tmp/n1/val")
file=$(train_losses "$tmp/one/train.h5" "$tmp/one/val.h5")
check "training from the sharded directory: the losses of the single file" "[ -n '$sharded' ] && [ '$sharded' = '$file' ]" ||
  echo "  sharded: $sharded / file: $file"

# ---- a changed shard is refused, by training and by inspect
cp -r "$tmp/n1" "$tmp/bad" && cp "$tmp/bad/train-00001.h5" "$tmp/bad/train-00002.h5"
timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config data/demo.json --set data.train="$tmp/bad" --set data.val= \
  --set run.dir="$tmp/badrun" --dry-run >/dev/null 2>"$tmp/bad.err"
check "training refuses a shard that is not the manifest's (exit $?), naming it" \
  "grep -q \"train-00002.h5' is not the file that '$tmp/bad/manifest.json' names\" '$tmp/bad.err'"
prep inspect "$tmp/bad" >/dev/null 2>"$tmp/bad.err"
check "inspect refuses it too" "[ $? = 1 ] && grep -q 'is not the file that' '$tmp/bad.err'"

# ---- a run killed at each step of re-making a directory: the old or the new data set, never a mix
prep "${common[@]}" --input "$tmp/b.txt" --out "$tmp/new" >/dev/null 2>&1
old=$(manifest_hashes "$tmp/n1")
new=$(manifest_hashes "$tmp/new")
for point in after-first-shard before-manifest after-switch during-cleanup; do
  rm -rf "$tmp/k" && cp -r "$tmp/n1" "$tmp/k"
  rc=$( { LLMPI_PREP_TEST_CRASH=$point "$PREP" "${common[@]}" --input "$tmp/b.txt" --out "$tmp/k" >/dev/null 2>&1; echo $?; } 2>/dev/null )
  now=$(manifest_hashes "$tmp/k")
  want=$old; [[ $point == after-switch || $point == during-cleanup ]] && want=$new
  check "killed at $point (exit $rc): the directory holds the $([ "$want" = "$old" ] && echo old || echo new) data set, every file verified" \
    "[ $rc = 137 ] && [ '$now' = '$want' ] && prep inspect '$tmp/k' --show 0 >/dev/null 2>&1"
  prep "${common[@]}" --input "$tmp/b.txt" --out "$tmp/k" >/dev/null 2>"$tmp/k.err"
  check "  ... a rerun reports what it left, takes its lock over, removes it and writes the new data set" \
    "[ $? = 0 ] && grep -q 'left by an interrupted llmpi-prep run' '$tmp/k.err' && grep -q 'taking over the output directory lock left by host $(hostname), pid [0-9]*' '$tmp/k.err' && [ \"\$(manifest_hashes '$tmp/k')\" = '$new' ] && [ \$(ls -A '$tmp/k' | wc -l) = \$(ls -A '$tmp/new' | wc -l) ]" ||
    cat "$tmp/k.err"
done

# ---- two runs on one --out: the second is refused at once, naming the first; the first run and
# the data set already there lose nothing. The first run reads a named pipe held open here, so it
# holds the lock (and has work files) until its input is written.
prep "${common[@]}" --input "$tmp/b.txt" --out "$tmp/busy" >/dev/null 2>&1
prep "${common[@]}" --input "$tmp/a.txt" --out "$tmp/a-alone" >/dev/null 2>&1
existing=$(manifest_hashes "$tmp/busy")
mkfifo "$tmp/feed"
exec 3<>"$tmp/feed"  # (read-write: opening it waits for nobody)
"$PREP" "${common[@]}" --input "$tmp/feed" --out "$tmp/busy" >"$tmp/first.out" 2>&1 3>&- &  # (not a writer itself)
first=$!
trap 'kill $first 2>/dev/null; rm -rf "$tmp"' EXIT
wait_for "grep -q '^pid $first\$' '$tmp/busy/.llmpi-prep.lock' 2>/dev/null && [ -d '$tmp/busy/.llmpi-prep-work' ]" $((60 * TIME_SCALE)) ||
  echo "warning: the first run did not take the lock" >&2
t0=$(date +%s)
prep "${common[@]}" --input "$tmp/a.txt" --out "$tmp/busy" >/dev/null 2>"$tmp/second.err"; rc=$?
check "a second run on the same --out: exit 1 at once, one error naming the first (host, pid) and the fix" \
  "[ $rc = 1 ] && [ \$((\$(date +%s) - t0)) -le $((10 * TIME_SCALE)) ] && [ \$(grep -c 'llmpi-prep: error' '$tmp/second.err') = 1 ] && grep -q \"llmpi-prep: error: --out '$tmp/busy' is in use by another llmpi-prep run (host $(hostname), pid $first, started .*Wait for that llmpi-prep run to end, or choose another --out\" '$tmp/second.err'" ||
  cat "$tmp/second.err"
check "  ... it removed nothing: the first run's work files and the data set already there are whole" \
  "[ -d '$tmp/busy/.llmpi-prep-work' ] && [ \"\$(manifest_hashes '$tmp/busy')\" = '$existing' ] && prep inspect '$tmp/busy' --show 0 >/dev/null 2>&1"
cat "$tmp/a.txt" >&3
exec 3>&-  # the end of the first run's input
wait $first; rc=$?
check "  ... the first run ends well: exit 0, the data set of its own input alone, its lock gone" \
  "[ $rc = 0 ] && [ \"\$(manifest_hashes '$tmp/busy')\" = \"\$(manifest_hashes '$tmp/a-alone')\" ] && [ ! -e '$tmp/busy/.llmpi-prep.lock' ] && [ ! -e '$tmp/busy/.llmpi-prep-work' ]" ||
  cat "$tmp/first.out"

# ---- resuming on a sharded data set: accepted on the same one, refused on another
rtrain() {
  timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$B/llmpi-train" --config data/demo.json --set data.train="$1" --set data.val= \
    --set run.dir="$tmp/rr" --set model.d_model=32 --set model.n_layer=1 --set model.seq_len=32 \
    --set train.log_every=1 --set train.eval_every=0 --set checkpoint.every=2 "${@:2}"
}
rtrain "$tmp/n1" --set train.steps=4 >/dev/null 2>&1
rtrain "$tmp/n1" --set train.steps=6 --resume auto >"$tmp/rr.out" 2>&1
check "resume on the same sharded data set: continues from step 4 (exit $?)" \
  "grep -q 'resumed from .*step-00000004.h5 at step 4' '$tmp/rr.out'" || tail -n 5 "$tmp/rr.out"
rtrain "$tmp/new" --set train.steps=8 --resume auto --dry-run >/dev/null 2>"$tmp/rr.err"
check "resume on another sharded data set: refused (exit $?), naming data.train" \
  "grep -q 'was made for data.train' '$tmp/rr.err'" || cat "$tmp/rr.err"

# ---- a failed run into a new directory leaves nothing behind
printf '{"text": "fine"}\nnot json\n' >"$tmp/bad.jsonl"
mprep 2 --tokenizer byte --input "$tmp/bad.jsonl" --out "$tmp/fresh" >/dev/null 2>"$tmp/err"
check "bad input on 2 ranks: exit 1, one error naming file:line, no directory left" \
  "[ $? = 1 ] && [ \$(grep -c 'llmpi-prep: error' '$tmp/err') = 1 ] && grep -q 'bad.jsonl:2: not valid JSON' '$tmp/err' && [ ! -e '$tmp/fresh' ]"

# ---- another program's directory, and the numeric flags
mkdir "$tmp/mine" && echo notes >"$tmp/mine/notes.txt"
prep --tokenizer byte --input "$tmp/b.txt" --out "$tmp/mine" >/dev/null 2>"$tmp/err"
check "a directory of other files is refused (exit 1), naming a file and --overwrite" \
  "[ $? = 1 ] && grep -q \"holds no llmpi-prep data set (it has 'notes.txt').*--overwrite\" '$tmp/err' && [ ! -e '$tmp/mine/manifest.json' ]"
prep --tokenizer byte --input "$tmp/b.txt" --out "$tmp/mine" --overwrite >/dev/null 2>&1
check "  ... --overwrite writes there and leaves the other files alone" \
  "[ $? = 0 ] && [ -f '$tmp/mine/manifest.json' ] && [ \"\$(cat '$tmp/mine/notes.txt')\" = notes ]"
cp "$tmp/b.txt" "$tmp/own/" 2>/dev/null || { mkdir "$tmp/own" && cp "$tmp/b.txt" "$tmp/own/"; }
prep --tokenizer byte --input "$tmp/own/b.txt" --out "$tmp/own" >/dev/null 2>&1
check "a directory that holds only the run's input is written without --overwrite" "[ $? = 0 ] && [ -f '$tmp/own/train.h5' ]"
bad_flag() {  # what, expected text, arguments...
  local what=$1 text=$2; shift 2
  mprep 2 "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  check "$what: exit 1, one error line naming the range" \
    "[ $rc = 1 ] && [ \$(grep -c 'llmpi-prep: error' '$tmp/err') = 1 ] && grep -qF -- \"\$text\" '$tmp/err'" || cat "$tmp/err"
}
bad_flag "--shard-tokens 0" "--shard-tokens '0' is outside 1..1,000,000,000,000" --tokenizer byte --input "$tmp/b.txt" --out "$tmp/f" --shard-tokens 0
bad_flag "--split-bytes 1K" "--split-bytes '1K' is outside 4K..1T" --tokenizer byte --input "$tmp/b.txt" --out "$tmp/f" --split-bytes 1K
bad_flag "--seed -1" "--seed '-1' is outside 0..18446744073709551615" --tokenizer byte --input "$tmp/b.txt" --out "$tmp/f" --seed -1
bad_flag "--val-fraction 1" "--val-fraction 1 is outside (0, 1)" --tokenizer byte --input "$tmp/b.txt" --out "$tmp/f" --val-fraction 1
bad_flag "a missing input" "cannot read input '$tmp/none.txt'" --tokenizer byte --input "$tmp/none.txt" --out "$tmp/f"
prep inspect "$tmp/n1" --show -1 >/dev/null 2>"$tmp/err"
check "inspect --show -1: exit 1 naming the range" "[ $? = 1 ] && grep -q -- '--show -1 is outside 0..1,000,000' '$tmp/err'"
"$B/llmpi-demo-corpus" --out "$tmp/b.txt" --megabytes 0.01 >/dev/null 2>"$tmp/err"
check "llmpi-demo-corpus refuses to replace a file unless --overwrite" \
  "[ $? = 1 ] && grep -q 'exists and is not empty.*--overwrite' '$tmp/err' && "'"$B/llmpi-demo-corpus"'" --out '$tmp/b.txt' --megabytes 0.01 --overwrite >/dev/null"
"$B/llmpi-demo-corpus" --out "$tmp/x.txt" --megabytes 0 >/dev/null 2>"$tmp/err"
check "llmpi-demo-corpus --megabytes 0: exit 1 naming the range" "[ $? = 1 ] && grep -q -- '--megabytes must be a number with 0 < M <= 100000' '$tmp/err'"
exit $status
