#!/usr/bin/env bash
# Production behaviour of the real program under mpiexec -n 2:
#   pre-emption (SIGUSR1 to mpiexec) -> one checkpoint, exit 0, PREEMPTED marker; --resume auto finishes;
#                                      never a handler on the compute thread (its signals blocked)
#   kill -9 of one rank            -> the job ends non-zero within 30 s; the last checkpoint still loads
#   a rank that stops answering    -> runtime.step_timeout_s aborts the job, naming the phase
#   disk full while checkpointing  -> clear error, non-zero exit, the previous checkpoint survives
#   bad input: unwritable run dir, nccl without a GPU, --dry-run on good and bad setups
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
TRAIN="$B/llmpi-train"
tmp=$(mktemp -d)
cleanup() { pkill -KILL -f "^$TRAIN .*$tmp" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

"$B/llmpi-demo-corpus" --out "$tmp/c.txt" --seed 3 --megabytes 0.3 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/c.txt" --out "$tmp/d" >/dev/null 2>&1
# A small model: ~25 ms per step here. Every run gets a run.dir under $tmp (the first --set, which a
# later one overrides), never data/demo.json's build/runs/demo that `make run` fills.
common=(--config data/demo.json --set run.dir="$tmp/default" --set data.train="$tmp/d/train.h5" --set data.val= --set model.d_model=64
        --set model.n_layer=2 --set model.seq_len=64 --set train.log_every=1 --set train.eval_every=0)

lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }

# start_run NAME ARGS...: an endless 2-rank run into $tmp/NAME in the background ($pid, $run,
# output in $tmp/NAME.out); rank_pids: its ranks' pids (not mpiexec's).
start_run() {
  run="$tmp/$1"; shift
  mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=100000 "$@" >"$run.out" 2>&1 &
  pid=$!
}
rank_pids() { pgrep -f "^$TRAIN .*$run"; }
# end_of_job: wait for mpiexec (killed after 40 s at most); $rc its exit code, $secs since $t0.
end_of_job() {
  ( sleep 40; kill -KILL $pid 2>/dev/null ) & local guard=$!
  wait $pid; rc=$?; secs=$(($(date +%s) - t0))
  kill $guard 2>/dev/null
}

# ---- pre-emption and resume
start_run pre
wait_for "[ \$(lines $run/metrics.jsonl) -ge 5 ]" 60
# The signals are blocked on each rank's main thread (the compute thread; a thread of its own
# takes them: src/runtime/signals.cpp): SigBlk holds SIGUSR1 (bit 9) and SIGTERM (bit 14).
blocked=0
for p in $(rank_pids); do
  m=$(awk '/^SigBlk:/ {print $2}' "/proc/$p/status" 2>/dev/null)
  [ -n "$m" ] && (( (16#$m & 16#4200) == 16#4200 )) && blocked=$((blocked + 1))
done
check "pre-emption signals blocked on both ranks' compute thread" "[ $blocked = 2 ]"
# As on a cluster: the scheduler signals every process of the job once — mpiexec, which forwards
# it to the ranks, and the ranks themselves — so each rank sees the signal twice.
kill -USR1 $pid; kill -USR1 $(rank_pids)
wait $pid; rc=$?
check "pre-emption (each rank signalled twice): exit 0" "[ $rc = 0 ]"
check "pre-emption: says how to resume" "grep -q 'pre-empted at step .*resume with --resume auto' '$run.out'"
check "pre-emption: PREEMPTED marker and checkpoint" "[ -f '$run/PREEMPTED' ] && ls '$run'/checkpoints/step-*.h5 >/dev/null"
at=$(grep -oP '^step \K[0-9]+' "$run/PREEMPTED")
steps=$((at + 5))
timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=$steps --resume auto >"$tmp/res.out" 2>&1
rc=$?
check "resume: exit 0 and continues at step $at" "[ $rc = 0 ] && grep -q 'resumed from .* at step $at' '$tmp/res.out'"
check "resume: metrics.jsonl has each of $steps steps once" \
  "[ \$(lines $run/metrics.jsonl) = $steps ] && [ \$(grep -oP '\"step\":\\K[0-9]+' $run/metrics.jsonl | sort -un | wc -l) = $steps ]"
check "resume: marker removed" "[ ! -f '$run/PREEMPTED' ]"

# ---- kill -9 of one rank
start_run kill --set checkpoint.every=5
wait_for "ls $run/checkpoints/step-*.h5 >/dev/null 2>&1 && [ \$(lines $run/metrics.jsonl) -ge 12 ]" 60
victim=$(rank_pids | tail -1); t0=$(date +%s)
kill -KILL "$victim"
end_of_job
check "kill -9 one rank: job ends non-zero (exit $rc) within 30 s ($secs s)" "[ $rc != 0 ] && [ $secs -le 30 ]"
timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=100000 --resume auto --dry-run >"$tmp/kr.out" 2>&1
check "kill -9 one rank: the last checkpoint loads" "grep -q 'resumed from .*checkpoints/step-' '$tmp/kr.out' && grep -q 'dry run' '$tmp/kr.out'"

# ---- a rank stops answering: the step watchdog ends the job
start_run stall --set runtime.step_timeout_s=3
wait_for "[ \$(lines $run/metrics.jsonl) -ge 5 ]" 60
victim=$(rank_pids | tail -1); t0=$(date +%s)
kill -STOP "$victim"
end_of_job
kill -KILL "$victim" 2>/dev/null
check "stalled rank: job ends non-zero (exit $rc) within 20 s ($secs s)" "[ $rc != 0 ] && [ $secs -le 20 ]"
check "stalled rank: the message names the step, phase and limit" \
  "grep -q \"has been in phase '.*' for .* longer than runtime.step_timeout_s\" '$run.out'" ||
  grep -vE '^(step|eval) ' "$run.out" | tail -n 8

# ---- disk full while checkpointing: the next checkpoint's temporary file is /dev/full, where
# every write fails with ENOSPC, exactly as on a full disk
run="$tmp/full"
timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=2 --set checkpoint.every=2 >/dev/null 2>&1
check "disk full: the first checkpoint is written" "[ -f '$run/checkpoints/step-00000002.h5' ]"
ln -s /dev/full "$run/checkpoints/step-00000004.h5.tmp"
timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=4 --set checkpoint.every=2 \
  --resume auto >"$tmp/full.out" 2>&1
rc=$?
check "disk full: non-zero exit ($rc), one message naming the cause" \
  "[ $rc != 0 ] && [ \$(grep -c 'No space left on device.*the previous checkpoint is untouched' '$tmp/full.out') = 1 ]"
check "disk full: no partial file, the previous checkpoint survives" \
  "[ ! -e '$run/checkpoints/step-00000004.h5' ] && [ ! -e '$run/checkpoints/step-00000004.h5.tmp' ] && [ -f '$run/checkpoints/step-00000002.h5' ]"
timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=4 --resume auto --dry-run >"$tmp/fr.out" 2>&1
check "disk full: the previous checkpoint loads" "grep -q 'at step 2' '$tmp/fr.out'"

# ---- more bad input, each one message and a non-zero exit
expect_error() {  # name needle args...
  local name=$1 needle=$2; shift 2
  timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" "$@" >"$tmp/e.out" 2>"$tmp/e.err"; local rc=$?
  check "$name: exit $rc, one message" "[ $rc != 0 ] && [ \$(grep -cF -- \"$needle\" '$tmp/e.err') = 1 ]"
}
expect_error "unwritable run directory" "cannot create run directory" --set run.dir=/etc/hostname/run
expect_error "nccl without a GPU" "needs the CUDA backend on a GPU" --set parallel.sync=nccl --set run.dir="$tmp/n"
expect_error "dry run: batch not divisible" "not divisible by the number of ranks (2)" --set train.global_batch=3 --dry-run
expect_error "checkpoint of another shape" "was made for model.d_model 64, but this configuration has 128" \
  --set run.dir="$tmp/full" --set model.d_model=128 --resume auto
timeout $((60 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$tmp/dry" --dry-run >"$tmp/dry.out" 2>&1
check "dry run on a good setup: exit 0, nothing written" "[ $? = 0 ] && grep -q 'dry run: configuration, data, world size' '$tmp/dry.out' && [ ! -e '$tmp/dry' ]"
exit $status
