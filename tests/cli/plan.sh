#!/usr/bin/env bash
# llmpi-plan through the real program: a plan of the committed configurations (no data file needed),
# the JSON it writes, a profile written and read back, and its errors (exit 2, one message naming
# the fix). Serial, a few seconds.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
LINKS=tests/fixtures/plan/links.json

"$B/llmpi-plan" --config data/plan/llama-7b.json --world 512 --pp 8 --microbatches 16 --zero 1 --device h100 \
  --link ib-ndr --precision bf16 --json "$tmp/p.json" >"$tmp/out" 2>"$tmp/err"
check "llama 7B at 512 GPUs: exit 0" "[ $? = 0 ]"
check "... per-stage memory rows and the time table" \
  "grep -q 'layers \[28,32) +head' '$tmp/out' && grep -q '^  zb-h1    1' '$tmp/out' && grep -q 'MFU 0.400 assumed' '$tmp/out'"
check "... the JSON holds every stage, schedule, ZeRO stage and precision" \
  "[ \$(grep -c '\"total\":' '$tmp/p.json') = 144 ] && [ \$(grep -c '\"step_s\":' '$tmp/p.json') = 6 ] && grep -q '\"dp\": 64' '$tmp/p.json'"

"$B/llmpi-plan" --config data/demo.json --set data.train= --vocab 256 --world 2 --pp 2 --microbatches 4 \
  --profile --profile-reps 1 --profile-out "$tmp/prof.json" --links "$LINKS" >"$tmp/out" 2>"$tmp/err"
check "--profile on this machine: exit 0, a profile written" "[ $? = 0 ] && grep -q llmpi-plan-profile '$tmp/prof.json'"
"$B/llmpi-plan" --config data/demo.json --set data.train= --vocab 256 --world 2 --pp 2 --microbatches 4 \
  --profile-in "$tmp/prof.json" --links "$LINKS" >"$tmp/out2" 2>"$tmp/err"
check "--profile-in reads it back: the same step times" \
  "[ $? = 0 ] && diff <(grep -A8 '^time per step' '$tmp/out') <(grep -A8 '^time per step' '$tmp/out2') >/dev/null"

expect_error() {  # name, pattern, args...
  local name=$1 pat=$2; shift 2
  "$B/llmpi-plan" "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  check "$name: exit 2 and one message" "[ $rc = 2 ] && grep -q -- \"$pat\" '$tmp/err' && [ \$(wc -l <'$tmp/err') = 1 ]"
}
expect_error "world not divisible by pp" "not divisible by the pipeline stages" --config data/plan/gpt2-124m.json --world 12 --pp 8
expect_error "micro-batches not dividing the replica's batch" "choose micro-batches dividing" \
  --config data/plan/gpt2-124m.json --world 64 --pp 4 --microbatches 5 --device h100
expect_error "an unknown device lists the valid ones" "use one of h100, h200, cpu" --config data/plan/gpt2-124m.json --device tpu
expect_error "an unknown link lists the valid ones" "shm, loopback, netns-1gbit, netns-10gbit, 1gbe" \
  --config data/plan/gpt2-124m.json --world 16 --device h100 --link pigeon
expect_error "a links file that cannot be read" "cannot read the links file" \
  --config data/plan/gpt2-124m.json --world 2 --intra-link netns-1gbit --links "$tmp/none.json"
expect_error "no vocabulary and no data file" "give --vocab N" --config data/demo.json --set data.train=
"$B/llmpi-plan" --help >"$tmp/help"
check "--help: exit 0, documents --profile and --link" "[ $? = 0 ] && grep -q -- '--profile-in' '$tmp/help' && grep -q -- '--gpus-per-node' '$tmp/help'"
exit $status
