#!/usr/bin/env bash
# Checkpoints written behind training (checkpoint.async, train/run.h) with the real program under
# mpiexec -n 2:
#   async on and off                  -> the same checkpoint files' tensors, bit for bit
#   a write slower than the steps     -> the next checkpoint waits for it, and says so
#   a rank killed during the write    -> NAME.tmp left, never taken for a checkpoint: the previous
#                                        checkpoint stays the newest, --resume auto continues from it
# LLMPI_CHECKPOINT_WRITE_DELAY_MS holds each write back, so that the kill lands inside one.
# runtime.cpu_fp32_gemm is pinned: "auto" times both engines at start-up, and two runs that pick
# different ones differ in the order of their fp32 sums, so in the last bits of every tensor.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
TRAIN="$B/llmpi-train"
tmp=$(mktemp -d)
cleanup() { pkill -KILL -f "^$TRAIN .*$tmp" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

"$B/llmpi-demo-corpus" --out "$tmp/c.txt" --seed 7 --megabytes 0.3 >/dev/null
"$B/llmpi-prep" --tokenizer byte --input "$tmp/c.txt" --out "$tmp/d" >/dev/null 2>&1
common=(--config data/demo.json --set data.train="$tmp/d/train.h5" --set data.val= --set model.d_model=64
        --set model.n_layer=2 --set model.seq_len=64 --set train.log_every=1 --set train.eval_every=0
        --set checkpoint.every=2 --set checkpoint.keep=5 --set runtime.cpu_fp32_gemm=openblas)
run_train() {  # OUT_NAME ARGS...: mpiexec -n 2 in the foreground, $rc
  local out=$1; shift
  timeout $((120 * TIME_SCALE)) mpiexec -n 2 "$TRAIN" "${common[@]}" "$@" >"$tmp/$out.out" 2>"$tmp/$out.err"; rc=$?
}

# ---- async on and off write the same checkpoints
run_train on --set run.dir="$tmp/on" --set train.steps=4
check "async on: exit 0 and the line says the write runs behind the steps" \
  "[ $rc = 0 ] && grep -q 'checkpoint: .*step-00000002.h5 (training waited [0-9.]* s; written behind the next steps)' '$tmp/on.out'" ||
  cat "$tmp/on.err"
run_train off --set run.dir="$tmp/off" --set train.steps=4 --set checkpoint.async=false
check "async on: the end of the run says how long it waited for the last write" \
  "grep -q 'checkpoint: .*step-00000004.h5 complete (the end of the run waited [0-9.]* s for it)' '$tmp/on.out'"
check "async off: exit 0, the step waits for the write" \
  "[ $rc = 0 ] && grep -q 'checkpoint: .*step-00000002.h5 (training waited [0-9.]* s)$' '$tmp/off.out'" || cat "$tmp/off.err"
same=1 n=0
for s in 2 4; do
  for ds in $(h5ls -r "$tmp/on/checkpoints/step-0000000$s.h5" | awk '$2 == "Dataset" {print $1}'); do
    a=$(h5dump -b LE -d "$ds" -o "$tmp/a.bin" "$tmp/on/checkpoints/step-0000000$s.h5" >/dev/null 2>&1 && md5sum <"$tmp/a.bin")
    b=$(h5dump -b LE -d "$ds" -o "$tmp/b.bin" "$tmp/off/checkpoints/step-0000000$s.h5" >/dev/null 2>&1 && md5sum <"$tmp/b.bin")
    [ -n "$a" ] && [ "$a" = "$b" ] || { same=0; echo "differs: step $s $ds"; }
    n=$((n + 1))
  done
done
check "async on and off: every tensor of both checkpoints the same bytes ($n datasets)" "[ $same = 1 ] && [ $n -ge 60 ]"

# ---- a write slower than checkpoint.every steps: the next checkpoint waits for it and says so
LLMPI_CHECKPOINT_WRITE_DELAY_MS=3000 run_train slow --set run.dir="$tmp/slow" --set train.steps=4
check "a write slower than the steps between checkpoints: the next one says training waited for it" \
  "[ $rc = 0 ] && grep -q 'checkpoint: .*step-00000002.h5 was still being written: training waited [1-9][0-9.]* s for it' '$tmp/slow.out'" ||
  cat "$tmp/slow.out" "$tmp/slow.err"

# ---- a rank killed while the step-4 checkpoint is being written
run="$tmp/killed"
LLMPI_CHECKPOINT_WRITE_DELAY_MS=4000 mpiexec -n 2 "$TRAIN" "${common[@]}" --set run.dir="$run" --set train.steps=6 \
  >"$tmp/k.out" 2>"$tmp/k.err" &
job=$!
# step 2's checkpoint completes when step 4's begins (each save waits for the one before)
if wait_for "[ -f '$run/checkpoints/step-00000004.h5.tmp' ]" $((90 * TIME_SCALE)); then
  victim=$(pgrep -f "^$TRAIN .*$run" | tail -n 1)
  kill -KILL "$victim"
  wait $job
  rc=$?
  check "killed mid-write: the job fails (exit $rc)" "[ $rc != 0 ]"
  check "killed mid-write: step 2 is complete, step 4 left only as .tmp" \
    "[ -f '$run/checkpoints/step-00000002.h5' ] && [ ! -f '$run/checkpoints/step-00000004.h5' ]"
  run_train resumed --set run.dir="$run" --set train.steps=6 --resume auto
  check "killed mid-write: --resume auto takes step 2 and finishes (exit $rc)" \
    "[ $rc = 0 ] && grep -q 'resumed from .*step-00000002.h5 at step 2' '$tmp/resumed.out' && [ -f '$run/checkpoints/step-00000006.h5' ]" ||
    tail -n 5 "$tmp/resumed.out" "$tmp/resumed.err"
else
  check "killed mid-write: the step-4 checkpoint's file appears" "false"
  cat "$tmp/k.out" "$tmp/k.err" | tail -n 20
fi
exit $status
