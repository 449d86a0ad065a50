#!/usr/bin/env bash
# Every parallel layout on the simulated card of tools/cuda_cpu_sim (build/sim-llmpi-train, each
# rank its own simulated H100; NCCL's stand-in over MPI): pipeline stages with every schedule,
# their messages through NCCL send/receive (parallel.sync=nccl) or MPI through page-locked host
# buffers, ZeRO-1 over NCCL (reduce-scatter, all-gather), ZeRO-2 and ZeRO-3 over NCCL and through
# host memory (the gradient and the blocks' parameters as device pages; with tensor parallelism and
# pipeline stages too), a ZeRO-3 checkpoint resumed, pipelines with ZeRO-1, a checkpoint
# of one layout resumed in another, and tensor parallelism (its collectives through NCCL or host
# memory, with pipeline stages), each against the unpipelined CPU run of the same model.
# Tiny models and 10 steps: the simulator takes ~0.1-0.3 s a step here. Not a GPU run
# (tools/cuda_cpu_sim/README.md says what the simulation cannot show).
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
SIM="$B/sim-llmpi-train"
[ -x "$SIM" ] || { echo "FAIL $SIM missing (make binaries)"; exit 1; }
STEPS=10

"$B/llmpi-demo-corpus" --out "$tmp/corpus.txt" --seed 7 --megabytes 1 >/dev/null &&
  "$B/llmpi-prep" --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/lm" >/dev/null
check "language-model data prepared" "[ -f '$tmp/lm/train.h5' ]" || exit $status
# A small entailment set in GLUE's RTE layout, for bert.
tiny_rte "$tmp/rte"
"$B/llmpi-prep" glue --task rte --data-dir "$tmp/rte" --tokenizer "hf:tests/fixtures/hf_tokenizers/wordpiece_small/tokenizer.json" \
  --max-seq-len 16 --out "$tmp/cls" >/dev/null
check "classification data prepared" "[ -f '$tmp/cls/train.h5' ]" || exit $status

# config FAMILY: a 4-layer model of the family (gpt2 and llama: the byte-level data; bert: the
# classification data)
config() {
  local data="\"train\": \"$tmp/lm/train.h5\", \"val\": \"$tmp/lm/val.h5\""
  local model="\"family\": \"$1\", \"n_layer\": 4, \"n_head\": 2, \"d_model\": 32, \"seq_len\": 16"
  if [ "$1" = bert ]; then
    data="\"train\": \"$tmp/cls/train.h5\", \"val\": \"$tmp/cls/dev.h5\""
    model="$model, \"num_labels\": 2"
  fi
  cat >"$tmp/$1.json" <<JSON
{"data": {$data}, "model": {$model},
 "train": {"global_batch": 8, "steps": $STEPS, "lr": 3e-3, "warmup_steps": 2, "eval_every": 0, "eval_batches": 1,
           "log_every": 1},
 "run": {"dir": "$tmp/run"}}
JSON
}
config gpt2 && config llama && config bert

# run NAME FAMILY PROGRAM RANKS SETTINGS...: a run into $tmp/NAME, its exit status returned (a
# setting that starts with -- is passed as it is)
run() {
  local name=$1 family=$2 prog=$3 np=$4; shift 4
  local sets=(); for s in "$@"; do case $s in --*) sets+=("$s") ;; *) sets+=(--set "$s") ;; esac; done
  timeout -k 5 $((120 * TIME_SCALE)) mpiexec -n "$np" "$prog" --config "$tmp/$family.json" --set checkpoint.every=0 \
    --set run.dir="$tmp/$name" "${sets[@]}" >>"$tmp/$name.log" 2>&1
}
# losses_within A B TOL [N]: both runs logged N losses ($STEPS unless given; steps 1..N once each,
# in order), each of B within TOL (relative) of A's
losses_within() {
  awk -v tol="$3" -v steps="${4:-$STEPS}" 'FNR == 1 {f++} match($0, /"loss": ?-?[0-9.eE+-]+/) {
      v = substr($0, RSTART + 7, RLENGTH - 7); l[f, ++n[f]] = v + 0 }
    END { if (n[1] != steps || n[2] != steps) exit 1
          for (i = 1; i <= steps; i++) { d = l[1, i] - l[2, i]; d = d < 0 ? -d : d
            a = l[1, i] < 0 ? -l[1, i] : l[1, i]; if (!(d <= tol * a)) exit 1 } }' \
    "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl"
}
CUDA=(runtime.device=cuda)
NCCL=(runtime.device=cuda parallel.sync=nccl parallel.bucket_mb=0.02)

run cpu gpt2 "$B/llmpi-train" 1 runtime.device=cpu
check "gpt2: the unpipelined CPU reference run" "[ $? = 0 ]" || exit $status

# Every schedule, messages through NCCL (a communicator per direction between stages): 2 stages,
# and gpipe over 4 (stages with a neighbour on each side).
for sch in gpipe 1f1b zb-h1 interleaved; do
  np=2 vs=1; [ $sch = gpipe ] && np=4; [ $sch = interleaved ] && vs=2
  run "nccl_$sch" gpt2 "$SIM" $np "${NCCL[@]}" parallel.pp_stages=$np parallel.microbatches=4 parallel.schedule=$sch \
    parallel.virtual_stages=$vs
  check "gpt2, $np stages $sch on the simulated card, NCCL send/receive: losses within 1e-5 of the CPU's" \
    "[ $? = 0 ] && losses_within cpu nccl_$sch 1e-5 && grep -q 'pipeline messages: NCCL send/receive' '$tmp/nccl_$sch.log'"
done
run mpi_1f1b gpt2 "$SIM" 2 "${CUDA[@]}" parallel.sync=allreduce parallel.pp_stages=2 parallel.microbatches=4
check "gpt2, 2 stages 1f1b, MPI through page-locked host buffers: losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu mpi_1f1b 1e-5 && grep -q 'pipeline messages: MPI through page-locked host buffers' '$tmp/mpi_1f1b.log'"

# ZeRO-1 over NCCL: 2 replicas, reduce-scatter during backward and all-gather after the update
# (bf16 gradients and 4 ranks: sim-cuda_tests' NcclRanks.ZeroMatchesMpiZero).
run nccl_dp gpt2 "$SIM" 2 "${NCCL[@]}"
run nccl_zero gpt2 "$SIM" 2 "${NCCL[@]}" parallel.zero=1
check "gpt2, 2 replicas, ZeRO-1 over NCCL: losses within 1e-6 of zero 0 over NCCL's" \
  "[ $? = 0 ] && losses_within nccl_dp nccl_zero 1e-6 && losses_within cpu nccl_zero 1e-5"
# ZeRO-2 over NCCL: the gradient as device pages (cuda_ops.h; 2 MiB chunks, no access where not
# backed), backed block by block and given back bucket by bucket. A model whose gradient spans
# chunks (8 layers, d 256: 25 MB in buckets of 8 MB, each giving back a chunk or two outside the
# rank's half): ZeRO-1's reduce-scatters of the same buckets, so ZeRO-1's losses to the bit, with
# less of the gradient ever backed than the whole and no more than the memory estimate counts; each micro-batch reduced (parallel.zero_reduce micro_batch,
# folded into the sum on the card) within rounding of reducing once a step.
# (2 steps, the second on moments and pages the first left: the simulated card runs this model at
# ~3.6 s a step)
Z2=(parallel.bucket_mb=8 model.n_layer=8 model.d_model=256 model.n_head=4 train.steps=2 train.warmup_steps=1)
run z1 gpt2 "$SIM" 2 "${NCCL[@]}" "${Z2[@]}" parallel.zero=1
run z2 gpt2 "$SIM" 2 "${NCCL[@]}" "${Z2[@]}" parallel.zero=2
rc=$?
# json_number RUN KEY_REGEX: a number of RUN's summary.json (read as one line)
json_number() { tr -d ' \n' <"$tmp/$1/summary.json" | grep -oP "$2\\K[0-9.e+]+" | head -1; }
peak_of() { json_number "$1" '"grad_device_pages_peak_bytes":'; }
params=$(json_number z2 '"n_params":')
estimate=$(json_number z2 '"memory_estimate_rank0":\{[^}]*"grads":')
check "gpt2, 2 replicas, ZeRO-2 over NCCL: ZeRO-1's losses to the bit; gradient backed at most $(peak_of z2) of $((4 * params)) bytes (estimate $estimate)" \
  "[ $rc = 0 ] && losses_within z1 z2 0 2 && [ \$(peak_of z2) -lt \$((4 * params)) ] &&
   awk 'BEGIN { exit !($(peak_of z2) <= $estimate) }'"
run z2m gpt2 "$SIM" 2 "${NCCL[@]}" "${Z2[@]}" parallel.zero=2 parallel.microbatches=2
rc=$?
run z2s gpt2 "$SIM" 2 "${NCCL[@]}" "${Z2[@]}" parallel.zero=2 parallel.microbatches=2 parallel.zero_reduce=step
rc2=$?
check "gpt2, ZeRO-2 over NCCL with 2 micro-batches: each reduced within 1e-5 of once a step, less backed than once a step" \
  "[ $rc = 0 ] && [ $rc2 = 0 ] && losses_within z2s z2m 1e-5 2 && [ \$(peak_of z2m) -lt \$(peak_of z2s) ]"
# ZeRO-3 over NCCL: the parameters as device pages too, each block backed and all-gathered on
# NCCL's stream just before it computes (the next one's gather enqueued meanwhile) and given back
# after: ZeRO-1's losses within 1e-6 (its buckets are cut at the blocks, so the norm sums its
# squares in other pieces), parameters backed at most as the estimate counts.
run z3 gpt2 "$SIM" 2 "${NCCL[@]}" parallel.zero=3 checkpoint.every=5
rc=$?
ppeak_of() { json_number "$1" '"param_device_pages_peak_bytes":'; }
pestimate=$(json_number z3 '"memory_estimate_rank0":\{[^}]*"params":')
check "gpt2, 2 replicas, ZeRO-3 over NCCL: within 1e-6 of ZeRO-1; parameters backed at most $(ppeak_of z3) bytes (estimate $pestimate)" \
  "[ $rc = 0 ] && losses_within nccl_zero z3 1e-6 && [ \$(ppeak_of z3) -gt 0 ] &&
   awk 'BEGIN { exit !($(ppeak_of z3) <= $pestimate) }'"
# Its step-5 checkpoint (each rank's pieces of the blocks) resumed: the same losses to the bit.
cp -r "$tmp/z3" "$tmp/z3r" && rm "$tmp/z3r/checkpoints/step-00000010.h5" &&
  run z3r gpt2 "$SIM" 2 "${NCCL[@]}" parallel.zero=3 --resume=auto
check "a ZeRO-3 checkpoint over NCCL resumed: ZeRO-3's losses to the bit" \
  "[ $? = 0 ] && grep -q 'resum' '$tmp/z3r.log' && losses_within z3 z3r 0"
# What is given back, on blocks of several chunks (8 layers d 512: 12.6 MB each, one bucket, so
# each rank's piece is half a block): one step backs under 80% of the parameters and the gradient.
run z3mem gpt2 "$SIM" 2 "${NCCL[@]}" model.n_layer=8 model.d_model=512 model.n_head=8 parallel.bucket_mb=16 \
  train.global_batch=2 train.steps=1 train.warmup_steps=0 parallel.zero=3
rc=$?
mparams=$(json_number z3mem '"n_params":')
check "gpt2 8 x 512, ZeRO-3 over NCCL, one step: parameters backed at most $(ppeak_of z3mem), gradient $(peak_of z3mem) of $((4 * mparams)) bytes" \
  "[ $rc = 0 ] && [ \$(ppeak_of z3mem) -lt \$((4 * mparams * 8 / 10)) ] && [ \$(peak_of z3mem) -lt \$((4 * mparams * 8 / 10)) ]"

# llama and bert, with 2 micro-batches reduced once a step: ZeRO-2 ZeRO-1's losses to the bit
# (the same buckets), ZeRO-3 within 1e-6.
for family in llama bert; do
  F=(parallel.microbatches=2); [ $family = bert ] && F+=(model.dropout=0 model.attn_dropout=0)
  run "${family}_z1" $family "$SIM" 2 "${NCCL[@]}" "${F[@]}" parallel.zero=1 &&
    run "${family}_z2" $family "$SIM" 2 "${NCCL[@]}" "${F[@]}" parallel.zero=2 parallel.zero_reduce=step &&
    run "${family}_z3" $family "$SIM" 2 "${NCCL[@]}" "${F[@]}" parallel.zero=3 parallel.zero_reduce=step
  check "$family, 2 replicas, 2 micro-batches, over NCCL: ZeRO-2 ZeRO-1's losses to the bit, ZeRO-3 within 1e-6" \
    "[ $? = 0 ] && losses_within ${family}_z1 ${family}_z2 0 && losses_within ${family}_z1 ${family}_z3 1e-6 &&
     [ \$(ppeak_of ${family}_z3) -gt 0 ]"
done

# ZeRO-2 and ZeRO-3 through host memory (an MPI method on the card: each bucket copied to page-locked
# host memory, reduce-scattered or all-gathered by MPI, its piece or the block copied back): ZeRO-2
# ZeRO-1's losses to the bit, ZeRO-3 within 1e-6, and with 2 micro-batches each reduced (the pieces
# summed on the card) within 1e-5.
MPI_CARD=(runtime.device=cuda parallel.sync=allreduce parallel.bucket_mb=0.02)
run mpi_z1 gpt2 "$SIM" 2 "${MPI_CARD[@]}" parallel.zero=1 &&
  run mpi_z2 gpt2 "$SIM" 2 "${MPI_CARD[@]}" parallel.zero=2 &&
  run mpi_z3 gpt2 "$SIM" 2 "${MPI_CARD[@]}" parallel.zero=3 &&
  run mpi_z3m gpt2 "$SIM" 2 "${MPI_CARD[@]}" parallel.zero=3 parallel.microbatches=2
check "gpt2, 2 replicas, ZeRO-2 and ZeRO-3 through host memory on the card: as over NCCL" \
  "[ $? = 0 ] && losses_within mpi_z1 mpi_z2 0 && losses_within mpi_z1 mpi_z3 1e-6 && losses_within mpi_z1 mpi_z3m 1e-5 &&
   [ \$(ppeak_of mpi_z3) -gt 0 ]"

# ZeRO-2 and ZeRO-3 with tensor parallelism (FSDP over each shard's data-parallel group) and with
# pipeline stages, 2 x 2 ranks: ZeRO-2 ZeRO-1's losses to the bit, ZeRO-3 within 1e-6.
for layout in tp pp; do
  case $layout in
    tp) L=(parallel.tp=2) ;;
    pp) L=(parallel.pp_stages=2 parallel.microbatches=2 parallel.schedule=1f1b) ;;
  esac
  run "${layout}_z1" gpt2 "$SIM" 4 "${NCCL[@]}" "${L[@]}" parallel.zero=1 &&
    run "${layout}_z2" gpt2 "$SIM" 4 "${NCCL[@]}" "${L[@]}" parallel.zero=2 &&
    run "${layout}_z3" gpt2 "$SIM" 4 "${NCCL[@]}" "${L[@]}" parallel.zero=3
  check "gpt2, $layout 2 x 2 replicas over NCCL: ZeRO-2 ZeRO-1's losses to the bit, ZeRO-3 within 1e-6" \
    "[ $? = 0 ] && losses_within ${layout}_z1 ${layout}_z2 0 && losses_within ${layout}_z1 ${layout}_z3 1e-6 &&
     [ \$(ppeak_of ${layout}_z3) -gt 0 ]"
done

# Pipelines with ZeRO-1 over NCCL: 2 stages x 2 replicas.
run nccl_pp_zero gpt2 "$SIM" 4 "${NCCL[@]}" parallel.zero=1 parallel.pp_stages=2 parallel.microbatches=2 \
  parallel.schedule=zb-h1
check "gpt2, 2 stages zb-h1 x 2 replicas with ZeRO-1, all through NCCL: losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu nccl_pp_zero 1e-5"

# A checkpoint of one layout resumed in another: step 5 of the 4-rank pipeline with ZeRO-1 (its
# moments gathered from the shards), resumed on 2 ranks as 2 replicas with ZeRO-1 over NCCL.
run resume gpt2 "$SIM" 4 "${NCCL[@]}" parallel.zero=1 parallel.pp_stages=2 parallel.microbatches=2 checkpoint.every=5 &&
  rm "$tmp/resume/checkpoints/step-00000010.h5" &&
  run resume gpt2 "$SIM" 2 "${NCCL[@]}" parallel.zero=1 --resume=auto
check "a 2-stage x 2-replica ZeRO-1 checkpoint resumed on 2 replicas: the 10 losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && grep -q 'resum' '$tmp/resume.log' && losses_within cpu resume 1e-5"

# Tensor parallelism: the group's sums and maxima through NCCL (no host wait) or through host
# memory (MPI), alone and with pipeline stages.
run tp_nccl gpt2 "$SIM" 2 "${NCCL[@]}" parallel.tp=2
check "gpt2, tensor parallelism over 2 simulated cards through NCCL: losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu tp_nccl 1e-5 && grep -q 'collectives over NCCL' '$tmp/tp_nccl.log'"
run tp_sp gpt2 "$SIM" 2 "${NCCL[@]}" parallel.tp=2 parallel.sequence_parallel=true
check "gpt2, tensor and sequence parallelism through NCCL (all-gather, reduce-scatter): losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu tp_sp 1e-5"

# llama (RMSNorm, RoPE, SwiGLU, untied head) and bert (a classifier, 2 stages).
run cpu_llama llama "$B/llmpi-train" 1 runtime.device=cpu &&
  run nccl_llama llama "$SIM" 2 "${NCCL[@]}" parallel.pp_stages=2 parallel.microbatches=4 parallel.schedule=zb-h1
check "llama, 2 stages zb-h1 through NCCL: losses within 1e-5 of the CPU's" "[ $? = 0 ] && losses_within cpu_llama nccl_llama 1e-5"
run tp_pp_llama llama "$SIM" 4 "${NCCL[@]}" parallel.tp=2 parallel.pp_stages=2 parallel.microbatches=4
check "llama, tensor parallelism 2 x 2 pipeline stages through NCCL: losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu_llama tp_pp_llama 1e-5"
# bert without dropout (its masks are keyed by micro-batch: with dropout a pipeline draws other
# masks than one batch does).
NODROP=(model.dropout=0 model.attn_dropout=0)
run cpu_bert bert "$B/llmpi-train" 1 runtime.device=cpu "${NODROP[@]}" &&
  run nccl_bert bert "$SIM" 2 "${NCCL[@]}" parallel.pp_stages=2 parallel.microbatches=2 "${NODROP[@]}"
check "bert (no dropout), 2 stages 1f1b through NCCL: losses within 1e-5 of the unpipelined CPU's" \
  "[ $? = 0 ] && losses_within cpu_bert nccl_bert 1e-5"
run tp_bert bert "$SIM" 2 "${CUDA[@]}" parallel.tp=2 "${NODROP[@]}"
check "bert (no dropout), tensor parallelism over 2 simulated cards through host memory: losses within 1e-5 of the CPU's" \
  "[ $? = 0 ] && losses_within cpu_bert tp_bert 1e-5 && grep -q 'collectives through host memory' '$tmp/tp_bert.log'"
exit $status
