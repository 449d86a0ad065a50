#!/usr/bin/env bash
# Issue 14 with the real program under mpiexec -n 2: run-directory ownership and memory.
#   two runs in one run.dir         -> the second fails at once naming the holder (host, pid);
#                                      the first is unharmed (metrics.jsonl stays parsable)
#   a stale lock                    -> taken over with a message (dead owner; held but owner gone)
#   a new run over an earlier one   -> refused naming --resume auto / another run.dir / --overwrite;
#                                      --overwrite moves the earlier files aside
#   a model or batch too big        -> one message with the estimate (and the largest batch that
#                                      fits), also under --dry-run; with the check off, the
#                                      std::bad_alloc is a clean collective error, not an abort
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
TRAIN="$B/llmpi-train"
tmp=$(mktemp -d)
holder=
cleanup() { [ -n "$holder" ] && kill "$holder" 2>/dev/null; pkill -KILL -f "^$TRAIN .*$tmp" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
# every line of a JSON Lines file is one object {...} (interleaved writes break this)
parsable() { [ -s "$1" ] && ! grep -qvE '^\{"[a-z_]+":.*\}$' "$1" && ! grep -q '}{' "$1"; }

"$B/llmpi-demo-corpus" --out "$tmp/c.txt" --seed 5 --megabytes 0.3 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/c.txt" --out "$tmp/d" >/dev/null 2>&1
# run.dir under $tmp unless a check sets its own (never data/demo.json's, which `make run` fills)
common=(--config data/demo.json --set run.dir="$tmp/default" --set data.train="$tmp/d/train.h5" --set data.val= --set model.d_model=64
        --set model.n_layer=2 --set model.seq_len=64 --set train.log_every=1 --set train.eval_every=0)
run_train() {  # OUT_NAME ARGS...: mpiexec -n 2 in the foreground, $rc
  local out=$1; shift
  timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" "$@" >"$tmp/$out.out" 2>"$tmp/$out.err"; rc=$?
}

# ---- finding 2: two runs in one directory
run="$tmp/both"
mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=100000 >"$tmp/first.out" 2>&1 &
first=$!
wait_for "[ \$(lines $run/metrics.jsonl) -ge 3 ]" 60
t0=$(date +%s)
run_train second --set run.dir="$run" --set train.steps=100000 --resume auto
check "second run in the same run.dir: non-zero exit ($rc) within 30 s" "[ $rc != 0 ] && [ $rc != 124 ] && [ \$((\$(date +%s) - t0)) -le 30 ]"
check "second run: one message naming the holder's host and pid" \
  "[ \$(grep -c \"run.dir '$run' is in use by another run (host $(hostname), pid [0-9]*, started\" '$tmp/second.err') = 1 ]" ||
  cat "$tmp/second.err"
pid_in_lock=$(grep -oP '^pid \K[0-9]+' "$run/LOCK")
check "the lock names a rank of the first run" "pgrep -f '^$TRAIN .*$run' | grep -qx '$pid_in_lock'"
run_train third --set run.dir="$run" --set train.steps=3
check "a new (not resumed) run is refused the same way" "[ $rc != 0 ] && grep -q 'is in use by another run' '$tmp/third.err'"
kill -USR1 $first; wait $first; rc=$?
check "the first run is unharmed: exit 0, metrics.jsonl parsable" "[ $rc = 0 ] && parsable '$run/metrics.jsonl'"
check "the lock is removed when the run ends" "[ ! -e '$run/LOCK' ]"

# ---- stale locks
run="$tmp/stale"
mkdir -p "$run"
printf 'host %s\npid 999999999\nstarted 2026-01-01T00:00:00Z\n' "$(hostname)" >"$run/LOCK"
run_train stale1 --set run.dir="$run" --set train.steps=2
check "stale lock file of a dead run: taken over with a message, exit 0" \
  "[ $rc = 0 ] && grep -q 'taking over the run directory lock left by host $(hostname), pid 999999999' '$tmp/stale1.err'"
# Held (by a process the dead owner left behind), naming a pid on this host that is gone.
run="$tmp/stale2"
mkdir -p "$run"
printf 'host %s\npid 999999999\n' "$(hostname)" >"$run/LOCK"
# Blocking flock: a non-blocking one could lose a race with the probe below (which takes the lock
# for an instant) and exit, leaving the lock free.
flock "$run/LOCK" sleep 60 & holder=$!
wait_for "! flock -n '$run/LOCK' true" 30 || echo "warning: the helper process did not take the lock" >&2
run_train stale2 --set run.dir="$run" --set train.steps=2
check "held lock naming a dead pid on this host: replaced, exit 0" \
  "[ $rc = 0 ] && grep -q 'names host $(hostname), pid 999999999, which no longer exists: taking it over' '$tmp/stale2.err'"
kill $holder 2>/dev/null; holder=

# ---- finding 1: a new run over an earlier one
run="$tmp/again"
run_train a1 --set run.dir="$run" --set train.steps=4 --set checkpoint.every=2
before=$(md5sum <"$run/metrics.jsonl")
run_train a2 --set run.dir="$run" --set train.steps=2 --set checkpoint.every=2
check "new run over an earlier one: non-zero exit, one message naming the ways out" \
  "[ $rc != 0 ] && [ \$(grep -c \"already holds a run (2 checkpoints (newest step 4), metrics.jsonl (4 lines)).*--resume auto, choose another run.dir, or pass --overwrite\" '$tmp/a2.err') = 1 ]" ||
  cat "$tmp/a2.err"
check "the refused run changed nothing" "[ \"\$(md5sum <'$run/metrics.jsonl')\" = '$before' ] && [ -f '$run/checkpoints/step-00000004.h5' ]"
run_train a3 --set run.dir="$run" --set train.steps=2 --set checkpoint.every=2 --overwrite
aside=$(ls -d "$run"/previous-* 2>/dev/null | head -1)
check "--overwrite: exit 0, the earlier files moved into previous-<date>/" \
  "[ $rc = 0 ] && [ -n '$aside' ] && [ \"\$(md5sum <'$aside/metrics.jsonl')\" = '$before' ] && [ -f '$aside/checkpoints/step-00000004.h5' ] && [ -f '$aside/config.json' ]"
check "--overwrite: the new run's files" "[ \$(lines $run/metrics.jsonl) = 2 ] && [ -f '$run/checkpoints/step-00000002.h5' ] && [ ! -e '$run/checkpoints/step-00000004.h5' ]"
run_train a4 --set run.dir="$run" --set train.steps=4 --set checkpoint.every=2 --resume auto
check "--resume auto continues the new run (step 2), not the moved one" "[ $rc = 0 ] && grep -q 'resumed from .*step-00000002.h5 at step 2' '$tmp/a4.out'"

# ---- finding 7: memory
run_train m0 --set run.dir="$tmp/m0" --dry-run
check "dry run prints the memory estimate" "[ $rc = 0 ] && grep -q '^memory per rank (estimate): params .* AdamW state .* activations .*; node: .* available' '$tmp/m0.out'"
# About 50 G parameters: 800 GB of parameters, gradients and AdamW state per rank.
huge=(--set model.d_model=8192 --set model.n_head=64 --set model.n_layer=64 --set run.dir="$tmp/huge")
for mode in --dry-run ""; do
  run_train huge "${huge[@]}" $mode
  check "model too big ${mode:-(training)}: exit $rc, one message with the estimate" \
    "[ $rc = 2 ] && [ \$(grep -c 'this configuration needs about .* GB per rank (params .*even one sequence per rank does not fit' '$tmp/huge.err') = 1 ]" ||
    cat "$tmp/huge.err"
done
# A pipeline stage is checked for what it holds: half the layers here, still far too many.
run_train huge_pp "${huge[@]}" --set parallel.pp_stages=2 --set parallel.microbatches=2 --dry-run
check "model too big for a pipeline of 2 stages: exit $rc, one message with the stage's estimate" \
  "[ $rc = 2 ] && [ \$(grep -c 'this configuration needs about .* GB per rank (params .*even one sequence per rank does not fit' '$tmp/huge_pp.err') = 1 ]" ||
  cat "$tmp/huge_pp.err"
# Activations too big (64 layers of 32-head attention over 256 tokens): the largest batch that fits.
big=(--set model.n_head=32 --set model.n_layer=64 --set model.seq_len=256 --set train.global_batch=256 --set run.dir="$tmp/big")
run_train big "${big[@]}" --dry-run
check "batch too big: the message names the largest global batch that fits" \
  "[ $rc = 2 ] && [ \$(grep -c 'activations .* (128 × 256 tokens).*the largest train.global_batch that fits is [0-9]* ([0-9]* per rank)' '$tmp/big.err') = 1 ]" ||
  cat "$tmp/big.err"
# With the check off, the allocation itself fails: a clean collective error, no abort.
# ---- keys set where they do nothing: one warning each on stderr, and the run goes on
run_train noeffect --set run.dir="$tmp/noeffect" --set train.steps=2 --set train.lr_schedule=constant \
  --set train.min_lr_ratio=0.2
check "keys without effect: exit 0, one warning each (train.min_lr_ratio, train.eval_every), from rank 0" \
  "[ $rc = 0 ] && [ \$(grep -c \"warning: 'train.min_lr_ratio' has no effect with train.lr_schedule \\\"constant\\\"\" '$tmp/noeffect.err') = 1 ] && [ \$(grep -c \"warning: 'train.eval_every' has no effect without data.val\" '$tmp/noeffect.err') = 1 ]" ||
  cat "$tmp/noeffect.err"
run_train zero1 --set run.dir="$tmp/zero1" --set parallel.tp=2 --set parallel.zero=1 --set model.n_head=4 --dry-run
check "parallel.zero with one data-parallel replica (tp 2 on 2 ranks): exit 0, one warning naming the layout" \
  "[ $rc = 0 ] && [ \$(grep -c \"warning: 'parallel.zero' has no effect with one data-parallel replica (2 ranks = 1 pipeline stages x 2 tensor-parallel ranks)\" '$tmp/zero1.err') = 1 ]" ||
  cat "$tmp/zero1.err"
run_train bad "${huge[@]}" --set runtime.memory_check=false --dry-run
check "std::bad_alloc: exit 2 on every rank, one clean message, no abort banner" \
  "[ $rc = 2 ] && [ \$(grep -c 'out of memory while allocating the model' '$tmp/bad.err') = 1 ] && ! grep -qE 'BAD TERMINATION|terminate called|Aborted' '$tmp/bad.err' '$tmp/bad.out'" ||
  cat "$tmp/bad.err"
exit $status
