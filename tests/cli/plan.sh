#!/usr/bin/env bash
# llmpi-plan through the real program: a plan of the committed configurations (no data file needed),
# the JSON it writes, a profile written and read back, and its errors (exit 2, one message naming
# the fix: bad values of every numeric option, output files it did not write, sizes beyond the
# code's integers). Serial, a few seconds.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
LINKS=tests/fixtures/plan/links.json

"$B/llmpi-plan" --config data/plan/llama-7b.json --world 512 --pp 8 --microbatches 16 --zero 1 --device h100 \
  --link ib-ndr --precision bf16 --json "$tmp/p.json" >"$tmp/out" 2>"$tmp/err"
check "llama 7B at 512 GPUs: exit 0" "[ $? = 0 ]"
check "... per-stage memory rows and the time table" \
  "grep -q 'layers \[28,32) +head' '$tmp/out' && grep -q '^  zb-h1    1' '$tmp/out' && grep -q 'MFU 0.400 assumed' '$tmp/out'"
check "... the JSON holds every stage, schedule, ZeRO stage and precision" \
  "[ \$(grep -c '\"total\":' '$tmp/p.json') = 288 ] && [ \$(grep -c '\"step_s\":' '$tmp/p.json') = 12 ] && grep -q '\"dp\": 64' '$tmp/p.json'"

# The checkpoint: 6.74B parameters + m + v = 80.9 GB, at 10 GB/s 8.1 s; the staging of every stage.
"$B/llmpi-plan" --config data/plan/llama-7b.json --world 64 --pp 8 --microbatches 16 --zero 1 --device h100 \
  --set checkpoint.every=50 --fs-bandwidth 10 --json "$tmp/ck.json" >"$tmp/out" 2>"$tmp/err"
check "llama 7B: the checkpoint's size, its time at --fs-bandwidth, each stage's staging" \
  "[ $? = 0 ] && grep -q 'checkpoint (one file.*80\.[0-9]* GB of params + AdamW m and v; 8\.1 s at 10 GB/s' '$tmp/out' \
   && [ \$(grep -A10 '^checkpoint (' '$tmp/out' | grep -c '^  [0-7]  ') = 8 ] && grep -q 'the run.s 50 does' '$tmp/out' \
   && grep -q '\"staging_bytes_per_stage\"' '$tmp/ck.json'"

"$B/llmpi-plan" --config data/demo.json --set data.train= --vocab 256 --world 2 --pp 2 --microbatches 4 \
  --profile --profile-reps 1 --profile-out "$tmp/prof.json" --links "$LINKS" >"$tmp/out" 2>"$tmp/err"
check "--profile on this machine: exit 0, a profile written" "[ $? = 0 ] && grep -q llmpi-plan-profile '$tmp/prof.json'"
"$B/llmpi-plan" --config data/demo.json --set data.train= --vocab 256 --world 2 --pp 2 --microbatches 4 \
  --profile-in "$tmp/prof.json" --links "$LINKS" >"$tmp/out2" 2>"$tmp/err"
check "--profile-in reads it back: the same step times" \
  "[ $? = 0 ] && diff <(grep -A8 '^time per step' '$tmp/out') <(grep -A8 '^time per step' '$tmp/out2') >/dev/null"

"$B/llmpi-plan" --config data/plan/gpt2-124m.json --set train.batch_per_rank=8 --world 16 --pp 2 --microbatches 4 \
  --device h100 >"$tmp/out" 2>"$tmp/err"
check "train.batch_per_rank: the global batch of --world / --pp replicas" \
  "[ $? = 0 ] && grep -q 'world 16 = 8 data-parallel x 2 stages; global batch 64 -> 8 per replica' '$tmp/out'"

"$B/llmpi-plan" --config data/plan/llama-7b.json --world 64 --tp 8 --zero 1 --device h100 --precision bf16 \
  --json "$tmp/tp.json" >"$tmp/out" 2>"$tmp/err"
check "--tp 8: world = replicas x stages x tp, the shard, the tensor-parallel all-reduces" \
  "[ $? = 0 ] && grep -q 'world 64 = 8 data-parallel x 1 stage x tp 8' '$tmp/out' && grep -q '4 of 32 heads' '$tmp/out' \
   && grep -q '^tensor-parallel all-reduces per step' '$tmp/out' && grep -q '\"tp\": 8' '$tmp/tp.json'"

expect_error() {  # name, pattern, args...
  local name=$1 pat=$2; shift 2
  timeout $((60 * TIME_SCALE)) "$B/llmpi-plan" "$@" >/dev/null 2>"$tmp/err"
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
expect_error "train.batch_per_rank against a global batch set beside it" "'train.global_batch' (64) and 'train.batch_per_rank' (16) are both set" \
  --config data/plan/gpt2-124m.json --set train.global_batch=64 --set train.batch_per_rank=16 --world 8 --device h100
expect_error "no vocabulary and no data file" "give --vocab N" --config data/demo.json --set data.train=
# Every numeric option in its range, naming the flag and the range (never planned with a default).
G=(--config data/plan/gpt2-124m.json --world 8)
expect_error "--pp -2" "--pp must be >= 1 (pipeline stages), got -2" "${G[@]}" --pp -2
expect_error "--microbatches -5" "--microbatches must be >= 1 (micro-batches per step per replica), got -5" "${G[@]}" --microbatches -5
expect_error "--zero -3" "--zero must be in .0, 3. (the run's ZeRO stage), got -3" "${G[@]}" --zero -3
expect_error "--zero 4" "--zero must be in .0, 3. (the run's ZeRO stage), got 4" "${G[@]}" --zero 4
expect_error "--world 0" "--world must be >= 1 (ranks in the run), got 0" --config data/plan/gpt2-124m.json --world 0
expect_error "--pp 0" "--pp must be >= 1 (pipeline stages), got 0" "${G[@]}" --pp 0
expect_error "--vocab 0" "--vocab must be >= 1 (vocabulary size), got 0" "${G[@]}" --vocab 0
expect_error "--mfu 1.5" "--mfu must be in (0, 1\] (the fraction of the device's peak the compute reaches), got 1.5" "${G[@]}" --mfu 1.5
expect_error "--mfu 0" "--mfu must be in (0, 1\]" "${G[@]}" --mfu 0
expect_error "--profile-reps 0" "--profile-reps must be >= 1 (repetitions per measured cost), got 0" "${G[@]}" --profile-reps 0
expect_error "--cores-per-rank 0" "--cores-per-rank must be >= 1 (cores per rank), got 0" "${G[@]}" --cores-per-rank 0
expect_error "--cores-per-node -1" "--cores-per-node must be >= 1 (cores of a node), got -1" "${G[@]}" --cores-per-node -1
expect_error "--gpus-per-node 0" "--gpus-per-node must be >= 1 (ranks per node), got 0" "${G[@]}" --gpus-per-node 0
expect_error "--tp 0" "--tp must be >= 1 (tensor-parallel ranks per group), got 0" "${G[@]}" --tp 0
expect_error "--tp 24 (12 heads)" "--tp must be in \[1, 12\] (tensor-parallel ranks per group, at most model.n_head), got 24" \
  --config data/plan/gpt2-124m.json --world 24 --tp 24
expect_error "--tp 5 does not divide the heads" "parallel.tp 5 does not divide model.n_head 12" \
  --config data/plan/gpt2-124m.json --world 10 --tp 5
expect_error "--tp across nodes" "--tp 16 does not divide the 8 ranks per node" \
  --config data/plan/llama-7b.json --world 32 --tp 16 --device h100
expect_error "--world not divisible by --pp x --tp" "not divisible by pp 2 x tp 4 = 8" \
  --config data/plan/gpt2-124m.json --pp 2 --tp 4 --world 12
expect_error "--fs-bandwidth 0" "--fs-bandwidth must be a positive number of GB/s (the file system's write bandwidth), got 0" \
  "${G[@]}" --fs-bandwidth 0
expect_error "--nics-per-node 0" "--nics-per-node must be >= 1 (network ports per node), got 0" "${G[@]}" --nics-per-node 0
expect_error "--world x" "llmpi-plan: error: Could not convert: --world = x; see llmpi-plan --help" --config data/plan/gpt2-124m.json --world x

# Sizes beyond the code's integers: refused at once (exit 2), one message naming the key and the limit.
expect_error "model.n_layer 2e9" "'model.n_layer' must be in 1..10000" "${G[@]}" --set model.n_layer=2000000000
expect_error "model.d_model 1.5e9: an MLP wider than an int" \
  "'model.d_model' 1,500,000,000 makes the MLP 6,000,000,000 wide (4 x model.d_model), more than 2,147,483,647" \
  "${G[@]}" --set model.d_model=1500000000 --set model.n_head=1
expect_error "model.d_model 8e8: a QKV projection wider than an int" \
  "'model.d_model' 800,000,000 makes the QKV projection 2,400,000,000 wide" \
  "${G[@]}" --set model.d_model=800000000 --set model.n_head=1 --set model.ffn_dim=64
expect_error "model.vocab_size 2^31-1: logits rows wider than an int" \
  "'model.vocab_size' 2,147,483,647 pads the LM head's rows of logits to 2,147,483,648 values" \
  "${G[@]}" --set model.vocab_size=2147483647
expect_error "1.2e19 parameters: byte counts beyond int64" \
  "the model has about 1.2e+19 parameters (model.n_layer 12 blocks of .*(2^56)" \
  "${G[@]}" --set model.d_model=500000000 --set model.n_head=1 --set model.ffn_dim=64
expect_error "a micro-batch of 2^32 token rows" "is 4294967296 token rows, more than 2147483647, the most the kernels take" \
  --config data/plan/gpt2-124m.json --set train.global_batch=4194304 --world 1 --microbatches 1
# A model of LLaMA 2 70B's shapes plans, with positive numbers everywhere.
"$B/llmpi-plan" --config data/plan/llama-70b.json --world 512 --pp 8 --tp 8 --microbatches 16 --zero 1 --device h100 \
  --precision bf16 >"$tmp/out" 2>"$tmp/err"
check "llama 70B at 512 GPUs: exit 0, 68,977M parameters, no negative number" \
  "[ $? = 0 ] && grep -q '^model llama: 80 layers, d_model 8192, 64 heads, ffn 28672, seq_len 4096, vocab 32000: 68976.65M parameters' '$tmp/out' && ! grep -qE '(^| )-[0-9]' '$tmp/out'" ||
  cat "$tmp/err"

# --json and --profile-out replace only llmpi-plan's own files, unless --overwrite.
echo '{"my": "notes"}' >"$tmp/notes.json"
expect_error "--json over a file llmpi-plan did not write" "'$tmp/notes.json' exists and was not written by llmpi-plan --json" \
  "${G[@]}" --json "$tmp/notes.json"
expect_error "--profile-out over a file llmpi-plan did not write" "'$tmp/notes.json' exists and was not written by llmpi-plan --profile-out" \
  "${G[@]}" --profile-out "$tmp/notes.json"
check "... the file untouched" "grep -q notes '$tmp/notes.json'"
"$B/llmpi-plan" "${G[@]}" --json "$tmp/p.json" >/dev/null 2>"$tmp/err"
check "--json over its own earlier plan: exit 0" "[ $? = 0 ] && grep -q '\"format\": \"llmpi-plan\"' '$tmp/p.json'"
"$B/llmpi-plan" "${G[@]}" --json "$tmp/notes.json" --overwrite >/dev/null 2>"$tmp/err"
check "--json with --overwrite replaces the file: exit 0" "[ $? = 0 ] && grep -q '\"format\": \"llmpi-plan\"' '$tmp/notes.json'"

"$B/llmpi-plan" --help >"$tmp/help"
check "--help: exit 0, documents --profile and --link" "[ $? = 0 ] && grep -q -- '--profile-in' '$tmp/help' && grep -q -- '--gpus-per-node' '$tmp/help'"
exit $status
