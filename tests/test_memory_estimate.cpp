// The memory estimate (model/memory_estimate.h) against what the code really allocates:
//   - byte counts: a copy of the CPU Ops table whose alloc/free count bytes; the model's
//     parameters, gradients, AdamW state, one micro-batch's activations and the backward scratch
//     of one step must equal the estimate exactly, for every family (Exact: integer byte counts,
//     held in doubles below 2^53);
//   - peak RSS: the resident-set growth of building the model and running one training step
//     (forward + backward + AdamW) must match the estimate (see the tolerance below).
#include <gtest/gtest.h>

#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model_test_util.h"
#include "optim/optimizer.h"
#include "params/param_table.h"
#include "model/memory_estimate.h"

using namespace llmpi;

namespace {

constexpr size_t kMmapThreshold = 1 << 20;  // the peak-RSS tests' M_MMAP_THRESHOLD

size_t g_allocated = 0;  // bytes requested through the counting table
size_t g_blocks = 0, g_heap_bytes = 0;  // blocks, and bytes in blocks under kMmapThreshold
void* counting_alloc(size_t bytes) {
  g_allocated += bytes;
  g_blocks++;
  if (bytes < kMmapThreshold) g_heap_bytes += bytes;
  return cpu_ops().alloc(bytes);
}

Ops counting_ops() {
  Ops o = cpu_ops();
  o.alloc = counting_alloc;
  return o;
}

Config config_with(const std::string& optimizer) {
  return parse_config("{}", "test", {"data.train=-", "train.optimizer=" + optimizer});
}

// The host part of the activation estimate (the per-row loss copy), which is not backend memory.
size_t host_loss_row(const ModelDesc& d, int B, int T) { return (d.head == HeadKind::lm ? (size_t)B * T : B) * 4; }

// kB from a "Key:   123 kB" line of /proc/self/status.
double status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string k;
  double v = -1;
  while (in >> k) {
    if (k == key) {
      in >> v;
      return v;
    }
    std::getline(in, k);
  }
  return -1;
}

// A shard's collectives on one process: each rank's partial sums left as they are, a gather that
// places only this rank's piece, a scatter that takes this rank's piece of its own buffer. The
// values are not the group's, but every buffer is allocated and touched as in a tensor-parallel run.
void local_tensor_group(Model& m) {
  const size_t r = (size_t)m.desc.tp_rank;
  m.tensor.sum = m.tensor.max = [](float*, size_t) {};
  m.tensor.all_gather = [r](const float* piece, float* whole, size_t n) {
    std::memcpy(whole + r * n, piece, n * sizeof(float));
  };
  m.tensor.reduce_scatter = [r](const float* whole, float* piece, size_t n) {
    std::memcpy(piece, whole + r * n, n * sizeof(float));
  };
}

// One training step's resident-set growth and the allowances that bound its difference from the
// estimate, in bytes.
struct StepGrowth {
  double peak = -1;  // the peak (VmHWM, reset first) less the RSS before; -1: cannot reset it
  // Above the estimate, what it leaves out by design:
  //  - measured: the code pages the step faults in for the first time (RssFile's growth; file
  //    pages stay resident without memory pressure), and the anonymous memory still resident
  //    once the model is freed: OpenBLAS's packed panels (its buffer is resident only where it
  //    has packed), the threads' scratch, heap pages kept;
  //  - bounded: what the heap held at the peak and may have trimmed since: init_params' host
  //    copy (numel floats) and the ops' temporaries (attention's three blocks of 64 x T per
  //    thread, the norms' partial sums of 2C per 128 rows), the heap's top pad and trim
  //    threshold (128 KiB each), and every block's rounding to 256 bytes, its header and its
  //    last page (4096 + 272 bytes a block).
  double above = 0;
  // Below it: a block under the mmap threshold comes from the heap and may land on pages resident
  // before, and the heap may trim free pages that were: at most those blocks' bytes and the
  // heap's free bytes before (every block is zero-filled, so the rest is resident).
  double below = 0;
};

// Building a Model of d (recompute rc; `prepare` sees it before its first forward), its AdamW
// state and the Activations of B x T tokens, and running one training step.
StepGrowth peak_growth_of_one_step(const ModelDesc& d, Recompute rc, int B, int T, const TrainConfig& tc,
                                   void (*prepare)(Model&) = nullptr) {
  test::RandomBatch batch(d, B, T, 3);
  StepGrowth g;
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) return g;
  }
  const Ops ops = counting_ops();  // (counts the blocks; allocates as cpu_ops)
  g_blocks = g_heap_bytes = 0;
  const double heap_free = (double)mallinfo2().fordblks;
  const double file_kb = status_kb("RssFile:"), anon_kb = status_kb("RssAnon:");
  const double before_kb = status_kb("VmRSS:");
  size_t numel = 0;
  {
    Model m(d, ops, ModelPart::whole(), GemmPrecision::fp32, rc);
    if (prepare) prepare(m);
    m.init_params(1);
    numel = m.table.numel;
    Optimizer opt(ops, m.table.numel, OptimizerKind::adamw);
    Activations a(m, B, T);
    m.forward(a, batch.b, HeadMode::train);
    m.backward(a);
    TrainConfig step_tc = tc;
    opt.step(m.params, m.grads, m.table, 1e-3, step_tc);
  }
  const double peak_kb = status_kb("VmHWM:");
  EXPECT_GT(before_kb, 0) << "VmRSS in /proc/self/status";
  g.peak = (peak_kb - before_kb) * 1024;
  const double N = (double)B * T, C = d.d_model;
  const double init_copy = 4.0 * numel < kMmapThreshold ? 4.0 * numel : 0;  // (larger: unmapped when freed)
  const double temporaries = 4 * (3 * 64.0 * T * omp_get_max_threads() + 2 * C * std::ceil(N / 128));
  g.above = std::max(0.0, status_kb("RssFile:") - file_kb) * 1024 + std::max(0.0, status_kb("RssAnon:") - anon_kb) * 1024 +
            init_copy + temporaries + 2 * 128 * 1024 + (4096.0 + 272) * g_blocks;
  g.below = (double)g_heap_bytes + heap_free;
  return g;
}

// Builds a Model of d (`prepare` sees it first), its optimizer and the Activations of B x T tokens
// through the counting table, runs two training steps, and expects each allocation to equal the
// estimate's count: the parameters and gradients (with bf16 the weight copy, 2 bytes a parameter
// plus its tensors' 256-byte alignment), the optimizer state, the activations (less the host's
// loss row), the backward scratch (less the CPU's bf16 operand scratch, thread-local host memory),
// and nothing in the second step. Returns the estimate.
MemoryEstimate expect_allocations_match(const ModelDesc& d, int B, int T, const Config& cfg, const std::string& what,
                                        void (*prepare)(Model&) = nullptr) {
  const GemmPrecision p = cfg.runtime.precision;
  const MemoryEstimate e = estimate_memory(d, B, T, cfg, 1, 0, false);
  const Ops ops = counting_ops();
  g_allocated = 0;
  Model m(d, ops, ModelPart::whole(), p, cfg.runtime.recompute);
  if (prepare) prepare(m);
  EXPECT_EQ((double)g_allocated, e.params + e.grads) << what;
  std::vector<size_t> copy_offsets;
  const double copy = p == GemmPrecision::bf16 ? 2.0 * aligned_copy_layout(m.table, &copy_offsets) : 0.0;
  EXPECT_EQ(e.params, (double)m.table.numel * 4 + copy) << what;
  EXPECT_LT(copy, (double)m.table.numel * 2 + 256.0 * m.table.slices.size()) << what;
  g_allocated = 0;
  Optimizer opt(ops, m.table.numel, cfg.train.optimizer);
  EXPECT_EQ((double)g_allocated, e.optimizer) << what << ": optimizer";
  g_allocated = 0;
  Activations a(m, B, T);
  EXPECT_EQ((double)g_allocated, e.activations - host_loss_row(d, B, T)) << what << ": activations";
  m.init_params(1);
  test::RandomBatch batch(d, B, T, 2);
  m.forward(a, batch.b, HeadMode::train);
  g_allocated = 0;
  m.backward(a);
  EXPECT_EQ((double)g_allocated, e.scratch - gemm_operand_scratch_bytes(d, B, T, p, false)) << what << ": backward scratch";
  g_allocated = 0;
  m.forward(a, batch.b, HeadMode::train);
  m.backward(a);
  EXPECT_EQ(g_allocated, 0u) << what << ": a second step allocates nothing more";
  return e;
}

}  // namespace

TEST(MemoryEstimate, ByteCountsEqualTheRealAllocations) {
  struct Case {
    std::string family;
    std::vector<std::string> extra;
    std::string optimizer;
    AttentionImpl attention = AttentionImpl::full;  // fused: lse per row instead of P, no T x T scratch
    int head_chunk_rows = 0;  // the chunked LM head's chunk buffer [rows, V] instead of [N, V]
    GemmPrecision precision = GemmPrecision::fp32;  // bf16: the Model's weight copy too
    Recompute recompute = Recompute::none;  // the recomputed tensors once, not per layer
  };
  for (const Case& c : {Case{"gpt2", {}, "adamw"}, Case{"gpt2", {"model.tie_embeddings=false"}, "sgd"},
                        Case{"llama", {"model.n_kv_head=1"}, "adamw"}, Case{"bert", {}, "adamw"},
                        Case{"gpt2", {}, "adamw", AttentionImpl::fused},
                        Case{"llama", {"model.n_kv_head=1"}, "adamw", AttentionImpl::fused},
                        Case{"bert", {}, "adamw", AttentionImpl::fused},
                        Case{"gpt2", {}, "adamw", AttentionImpl::full, 5},
                        Case{"llama", {"model.n_kv_head=1"}, "adamw", AttentionImpl::fused, 1},
                        Case{"gpt2", {}, "adamw", AttentionImpl::full, 5, GemmPrecision::bf16},
                        Case{"bert", {}, "sgd", AttentionImpl::fused, 0, GemmPrecision::bf16},
                        Case{"llama", {"model.n_kv_head=1"}, "adamw", AttentionImpl::fused, 3, GemmPrecision::bf16},
                        Case{"gpt2", {}, "adamw", AttentionImpl::full, 0, GemmPrecision::fp32, Recompute::selective},
                        Case{"bert", {}, "adamw", AttentionImpl::full, 0, GemmPrecision::bf16, Recompute::full},
                        Case{"llama", {"model.n_kv_head=1"}, "adamw", AttentionImpl::fused, 3, GemmPrecision::bf16,
                             Recompute::selective},
                        Case{"llama", {}, "sgd", AttentionImpl::full, 0, GemmPrecision::fp32, Recompute::full}}) {
    const int B = 3, T = 12;
    ModelDesc d = test::desc_of(c.family, 2, 2, 16, T, 37, c.extra);
    d.attention = c.attention;
    d.lm_head_chunk_rows = c.head_chunk_rows;
    Config cfg = config_with(c.optimizer);
    cfg.runtime.precision = c.precision;
    cfg.runtime.recompute = c.recompute;
    expect_allocations_match(d, B, T, cfg, c.family + " " + c.optimizer);
  }
}

// Gradient accumulation (parallel.microbatches M, pp_stages 1) holds one micro-batch at a time:
// the estimate's activations and backward scratch are those of local_batch / M sequences (the batch
// itself stays on the host whole), and the step engine allocates exactly that: the parameters,
// gradients, AdamW state and one activation slot of the micro-batch.
TEST(MemoryEstimate, GradientAccumulationHoldsOneMicroBatch) {
  const int B = 8, T = 12, M = 4;
  for (const char* family : {"gpt2", "llama", "bert"}) {
    const ModelDesc d = test::desc_of(family, 2, 2, 16, T, 37);
    Config cfg = config_with("adamw");
    const MemoryEstimate whole = estimate_memory(d, B, T, cfg, 1, 0, false);
    const MemoryEstimate micro = estimate_memory(d, B / M, T, cfg, 1, 0, false);
    cfg.parallel.microbatches = M;
    const MemoryEstimate e = estimate_memory(d, B, T, cfg, 1, 0, false);
    EXPECT_EQ(e.micro_batch, B / M) << family;
    EXPECT_EQ(e.activations, micro.activations) << family;
    EXPECT_EQ(e.scratch, micro.scratch) << family;
    EXPECT_LT(e.activations, whole.activations / 2) << family;
    EXPECT_EQ(e.data, whole.data) << family;  // the step's batch is read whole
    EXPECT_EQ(e.params + e.grads + e.optimizer, whole.params + whole.grads + whole.optimizer) << family;
    const Ops ops = counting_ops();
    ParallelGroups groups(MPI_COMM_SELF, 1, false);
    EngineOptions eo;
    eo.local_batch = B;
    eo.T = T;
    eo.seed = 1;
    g_allocated = 0;
    Engine engine(d, ops, groups, cfg.parallel, sync_options(cfg.parallel), eo);
    EXPECT_EQ(engine.micro_batch, B / M) << family;
    EXPECT_EQ(engine.chunks.front().slots.size(), 1u) << family << ": one micro-batch alive at a time";
    EXPECT_EQ((double)g_allocated,
              e.params + e.grads + e.optimizer + e.activations - host_loss_row(d, B / M, T)) << family;
  }
}

TEST(MemoryEstimate, CheckpointAndSyncBuffersFollowTheConfiguration) {
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 16, 8, 37);
  Config cfg = config_with("adamw");
  const double nb = 4.0 * estimate_memory(d, 1, 8, cfg, 1, 0, false).n_params;
  // No checkpoint saved (checkpoint.every 0): a resume's one state of the rank's chunks.
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 1, 0, false).checkpoint_save, 0);
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 1, 0, false).checkpoint_staging, nb);
  // Saved behind the steps: one rank stages everything it writes: params, m, v ...
  cfg.checkpoint.every = 10;
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 1, 0, false).checkpoint_save, 3 * nb);
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 1, 0, false).checkpoint_staging, 3 * nb);
  // ... synchronously on the CPU nothing (it writes from the buffers), from a GPU the same copy.
  cfg.checkpoint.async = false;
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 1, 0, false).checkpoint_save, 0);
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 1, 0, true).checkpoint_save, 3 * nb);
  cfg.checkpoint.async = true;
  // Replicas take turns: every value is staged once over the data-parallel group (sums of whole
  // tensors' float counts: exact), each rank less than all of it. With ZeRO-1 the moments are each
  // rank's own pieces; with sync "weights" every rank writes its own copy of everything.
  for (const bool zero : {false, true}) {
    cfg.parallel.zero = zero;
    double sum = 0;
    for (int rank = 0; rank < 4; rank++) {
      const MemoryEstimate e = estimate_memory(d, 1, 8, cfg, 4, rank, false);
      EXPECT_LT(e.checkpoint_save, 3 * nb) << "zero " << zero << " rank " << rank;
      EXPECT_EQ(e.checkpoint_staging, std::max(e.checkpoint_save, nb));
      sum += e.checkpoint_save;
    }
    EXPECT_EQ(sum, 3 * nb) << "zero " << zero;
  }
  cfg.parallel.zero = false;
  cfg.parallel.sync = SyncMethod::weights;
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 4, 1, false).checkpoint_save, 3 * nb);
  cfg.parallel.sync = SyncMethod::allreduce;
  // Tensor parallelism: the shards' tensors are each shard's own, the whole ones taken in turn by
  // the tensor group's ranks: over 2 replicas × 2 shards every value of the model once again.
  {
    double sum = 0;
    for (int tp_rank = 0; tp_rank < 2; tp_rank++)
      for (int rank = 0; rank < 2; rank++) {
        RankChunks rc;
        rc.tp = 2, rc.tp_rank = tp_rank;
        sum += estimate_memory(tensor_shard(d, 2, tp_rank), 1, 8, cfg, 2, rank, false, &rc).checkpoint_save;
      }
    EXPECT_EQ(sum, 3 * nb);
  }
  cfg.parallel.zero = false;
  cfg.parallel.sync = SyncMethod::gather_scatter;
  cfg.parallel.bucket_mb = 1e6;  // one bucket: rank 0 gathers and scatters 4 copies of everything
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 4, 0, false).sync_buffers, 2 * 4 * nb);
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, 4, 1, false).sync_buffers, 0);
  // Activations grow with the batch: what the "largest batch that fits" search relies on.
  EXPECT_LT(estimate_memory(d, 2, 8, cfg, 1, 0, false).activations, estimate_memory(d, 3, 8, cfg, 1, 0, false).activations);
}

// With parallel.sync nccl the exchange's buffers are NcclComm's, on the device (comm/nccl.h):
// ZeRO-1's W pieces of the largest bucket padded to ceil(n/W), in fp32 and, for a bf16 gradient,
// in bf16 as well; without ZeRO-1 only a bf16 gradient's copy of the largest bucket (fp32 is
// reduced in place). None of MPI's host pieces are counted for them.
TEST(MemoryEstimate, NcclBuffersAreDeviceMemory) {
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 16, 8, 37);
  Config cfg = config_with("adamw");
  cfg.parallel.sync = SyncMethod::nccl;
  cfg.parallel.bucket_mb = cfg.parallel.first_bucket_mb = 1e6;  // one bucket: the whole model
  const size_t n = (size_t)estimate_memory(d, 1, 8, cfg, 1, 0, true).n_params, W = 3, c = (n + W - 1) / W;
  ASSERT_NE(n % W, 0u) << "the padding is not exercised";
  const MemoryEstimate fp32 = estimate_memory(d, 1, 8, cfg, W, 0, true);
  EXPECT_EQ(fp32.nccl_buffers, 0);
  EXPECT_EQ(fp32.sync_buffers, 0);
  cfg.parallel.grad_dtype = GradDtype::bf16;
  EXPECT_EQ(estimate_memory(d, 1, 8, cfg, W, 0, true).nccl_buffers, 2.0 * n);
  cfg.parallel.zero = true;
  const MemoryEstimate zero16 = estimate_memory(d, 1, 8, cfg, W, 1, true);
  EXPECT_EQ(zero16.nccl_buffers, (4.0 + 2.0) * W * c);
  EXPECT_EQ(zero16.sync_buffers, 0);
  cfg.parallel.grad_dtype = GradDtype::fp32;
  const MemoryEstimate zero32 = estimate_memory(d, 1, 8, cfg, W, 1, true);
  EXPECT_EQ(zero32.nccl_buffers, 4.0 * W * c);
  EXPECT_EQ(zero32.device_bytes() - zero32.nccl_buffers,
            zero32.params + zero32.grads + zero32.optimizer + zero32.activations + zero32.scratch);
  EXPECT_EQ(zero32.host_bytes(), zero32.checkpoint_staging + zero32.data);
  EXPECT_NE(zero32.describe().find("NCCL buffers"), std::string::npos) << zero32.describe();
  // Over MPI the same ZeRO-1 layout holds its pieces on the host instead.
  cfg.parallel.sync = SyncMethod::allreduce;
  const MemoryEstimate mpi = estimate_memory(d, 1, 8, cfg, W, 1, true);
  EXPECT_EQ(mpi.nccl_buffers, 0);
  EXPECT_GT(mpi.sync_buffers, 0);
}

// runtime.precision bf16 adds the GEMMs' operand scratch: the largest dense call's operands side by
// side, here the LM head's backward (dout N·V, W V·C, inp N·C; the first two padded), as fp32
// copies on the CPU; on the GPU bf16 (plus the workspace's quarter of headroom) without W and the
// head's dout, which it reads in place; nothing in fp32 or tf32.
TEST(MemoryEstimate, Bf16CountsTheGemmOperandScratch) {
  const int B = 3, T = 8, V = 501, C = 16;
  const ModelDesc d = test::desc_of("gpt2", 2, 2, C, T, V);
  Config cfg = config_with("adamw");
  const double fp32 = estimate_memory(d, B, T, cfg, 1, 0, false).scratch;
  cfg.runtime.precision = GemmPrecision::tf32;
  EXPECT_EQ(estimate_memory(d, B, T, cfg, 1, 0, true).scratch, estimate_memory(d, B, T, config_with("adamw"), 1, 0, true).scratch);
  cfg.runtime.precision = GemmPrecision::bf16;
  const size_t N = (size_t)B * T;
  auto pad = [](size_t n, size_t q) { return (n + q - 1) / q * q; };
  EXPECT_EQ(estimate_memory(d, B, T, cfg, 1, 0, false).scratch - fp32,
            4.0 * (pad(N * V, 16) + pad((size_t)V * C, 16) + N * C));
  // On the GPU W takes no scratch (the calls read the Model's bf16 weight copy), nor does the LM
  // head's dout (its logits gradient comes in bf16), nor the norms' outputs and the MLP's
  // activation output (GPT-2's GELU, LLaMA's SwiGLU: kept in bf16), so only the attention
  // output's input is converted: the largest call is that layer's backward (dout and inp N·C) or
  // a backward whose only converted operand is dout (QKV: N·QKV; the MLP's first layer: N·FC,
  // GPT-2 4C, LLaMA 2F) — here the MLP's first layer, N·4C (a multiple of 128: 1536 values).
  for (const char* family : {"gpt2", "llama"}) {
    const ModelDesc dm = test::desc_of(family, 2, 2, C, T, V);
    EXPECT_EQ(gemm_operand_scratch_bytes(dm, B, T, GemmPrecision::bf16, true),
              std::max({pad(N * C, 128) + N * C, pad(N * dm.qkv_dim(), 128), pad(N * dm.fc_dim(), 128)}) * 2 * 5 / 4)
        << family;
  }
  EXPECT_EQ(gemm_operand_scratch_bytes(d, B, T, GemmPrecision::bf16, true), N * 4 * C * 2 * 5 / 4);
  // The copy itself: 2 bytes per parameter (each tensor 256-byte aligned), with the parameters.
  std::vector<size_t> copy_offsets;
  EXPECT_EQ(estimate_memory(d, B, T, cfg, 1, 0, true).params - estimate_memory(d, B, T, config_with("adamw"), 1, 0, true).params,
            2.0 * aligned_copy_layout(build_param_table(d), &copy_offsets));
  EXPECT_EQ(gemm_operand_scratch_bytes(d, B, T, GemmPrecision::fp32, false), 0u);
  // The chunked LM head: its backward's operands are one chunk's (R = 5 rows), still the largest.
  ModelDesc dc = d;
  dc.lm_head_chunk_rows = 5;
  EXPECT_EQ(estimate_memory(dc, B, T, cfg, 1, 0, false).scratch - fp32,
            4.0 * (pad(5 * V, 16) + pad((size_t)V * C, 16) + 5 * C));
  EXPECT_EQ(gemm_operand_scratch_bytes(dc, B, T, GemmPrecision::bf16, false),
            4 * (pad(5 * V, 16) + pad((size_t)V * C, 16) + 5 * C));
}

// Under AddressSanitizer (make SAN=1) a process's RSS also holds ASan's shadow memory, its
// redzones and its quarantine of freed blocks: the peak-RSS comparisons below run in the normal
// build only (the estimates' own checks run in both).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssIsTheModels = false;
#else
constexpr bool kRssIsTheModels = true;
#endif
constexpr const char* kRssSkip = "the peak RSS under AddressSanitizer holds its shadow memory and redzones: "
                                 "compared in the normal build";
// A process's peak and resident set hold what earlier tests left mapped (freed blocks the
// allocator keeps, buffers of libraries): a peak-RSS comparison means something only in a process
// that runs it alone. tools/run_tests.sh runs each *PeakRss* test so (llmpi-tests
// --gtest_filter=NAME); in a run of several tests they skip and say so.
bool alone_in_process() { return testing::UnitTest::GetInstance()->test_to_run_count() == 1; }
constexpr const char* kNotAlone = "a peak-RSS comparison runs alone in its process "
                                  "(llmpi-tests --gtest_filter=<this test>), as tools/run_tests.sh runs it";

// runtime.recompute too: the activations selective and full keep (one shared set of the
// recomputed tensors per micro-batch), against the peak of a step that recomputes.
TEST(MemoryEstimate, PeakRssOfOneStepMatches) {
  // Activations dominate (about 190 MB without recomputation), as they do when a batch does not fit.
  const int B = 32, T = 256;
  const ModelDesc d = test::desc_of("gpt2", 2, 4, 64, T, 256);
  // Blocks of 1 MB and more mapped and unmapped one by one (glibc would otherwise raise its
  // threshold after the first free and serve the next mode's tensors from pages still resident)
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const bool measure = kRssIsTheModels && alone_in_process();
  double predicted_none = 0;
  for (const Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
    Config cfg = config_with("adamw");
    cfg.runtime.recompute = rc;
    const MemoryEstimate e = estimate_memory(d, B, T, cfg, 1, 0, false);
    const double predicted = e.params + e.grads + e.optimizer + e.activations + e.scratch;
    if (rc == Recompute::none) predicted_none = predicted;
    else EXPECT_LT(predicted, predicted_none * 0.9) << option_name(rc);
    if (!measure) continue;
    const StepGrowth g = peak_growth_of_one_step(d, rc, B, T, cfg.train);
    const double measured = g.peak;
    if (measured < 0) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
    std::printf("recompute %s: memory estimate %.1f MB, measured peak RSS growth %.1f MB (%.2f%%; allowed "
                "+%.1f / -%.1f MB)\n", option_name(rc), predicted / 1e6, measured / 1e6,
                100.0 * (measured - predicted) / predicted, g.above / 1e6, g.below / 1e6);
    // Neither exact nor a rounding bound: the estimate counts every buffer the model,
    // activations, scratch and optimizer allocate (exact, test above); the measurement adds or
    // lacks only what StepGrowth's allowances cover.
    EXPECT_LE(measured, predicted + g.above) << option_name(rc);
    EXPECT_GE(measured, predicted - g.below) << option_name(rc);
  }
  if (!kRssIsTheModels) GTEST_SKIP() << kRssSkip;
  if (!measure) GTEST_SKIP() << kNotAlone;
}


// Tensor parallelism (parallel.tp = T): the estimate of shard r of T (tensor_shard) equals what
// that shard allocates: its parameter table's slices, activations with its heads, MLP channels and
// vocabulary rows (N·C tensors whole, or with sequence parallelism the residual stream's N/T rows
// and the gather and scatter buffers), the cross-entropy's statistics, no bf16 logits gradient, the
// backward scratch. A shard Model builds on one process; its collectives are stand-ins here.
TEST(MemoryEstimate, TensorShardByteCountsEqualTheRealAllocations) {
  struct Case {
    std::string family;
    std::vector<std::string> extra;
    AttentionImpl attention;
    GemmPrecision precision;
    Recompute recompute;
    bool sequence_parallel = false;
  };
  const int B = 2, T = 12, V = 37;  // (37 rows split unevenly: 9 + 9 + 9 + 10)
  for (const Case& c : {Case{"gpt2", {}, AttentionImpl::full, GemmPrecision::fp32, Recompute::none},
                        Case{"gpt2", {"model.tie_embeddings=false"}, AttentionImpl::fused, GemmPrecision::bf16,
                             Recompute::none},
                        Case{"llama", {"model.n_kv_head=4"}, AttentionImpl::full, GemmPrecision::bf16,
                             Recompute::selective},
                        Case{"llama", {"model.n_kv_head=4"}, AttentionImpl::fused, GemmPrecision::fp32, Recompute::full},
                        Case{"bert", {}, AttentionImpl::full, GemmPrecision::fp32, Recompute::none},
                        Case{"bert", {}, AttentionImpl::fused, GemmPrecision::bf16, Recompute::selective},
                        Case{"gpt2", {}, AttentionImpl::full, GemmPrecision::bf16, Recompute::none, true},
                        Case{"llama", {"model.n_kv_head=4"}, AttentionImpl::fused, GemmPrecision::fp32,
                             Recompute::selective, true},
                        Case{"bert", {}, AttentionImpl::full, GemmPrecision::fp32, Recompute::full, true}}) {
    ModelDesc whole = test::desc_of(c.family, 2, 8, 32, T, V, c.extra);
    whole.attention = c.attention;
    whole.lm_head_chunk_rows = 7;  // several chunks, the last one short
    whole.sequence_parallel = c.sequence_parallel;
    Config cfg = config_with("adamw");
    cfg.runtime.precision = c.precision;
    cfg.runtime.recompute = c.recompute;
    const double whole_bytes = [&] {
      const MemoryEstimate e = estimate_memory(whole, B, T, cfg, 1, 0, false);
      return e.params + e.grads + e.optimizer + e.activations + e.scratch;
    }();
    for (int tp : {2, 4}) {
      for (int r = 0; r < tp; r++) {
        const std::string what = c.family + " tp " + std::to_string(tp) + (c.sequence_parallel ? " sp" : "") +
                                 " shard " + std::to_string(r);
        const ModelDesc d = tensor_shard(whole, tp, r);
        const MemoryEstimate e = expect_allocations_match(d, B, T, cfg, what, local_tensor_group);
        // A shard holds less than the whole model: its blocks' wide tensors, its vocabulary rows.
        EXPECT_LT(e.params + e.grads + e.optimizer + e.activations + e.scratch, whole_bytes) << what;
      }
    }
  }
}

// The per-rank memory falls with parallel.tp as the estimate says: for T = 1, 2, 4 (and 4 with
// sequence parallelism) the last (the largest) shard's estimate against the peak RSS growth of
// building it and running one training step, within 10%; and the estimate of T = 4 is below half
// of T = 1's for a model whose attention probabilities, MLP and vocabulary (all split) dominate,
// lower again with the residual stream split too.
TEST(MemoryEstimate, TensorShardPeakRssFallsAsEstimated) {
  const int B = 8, T = 256;
  const ModelDesc whole = test::desc_of("gpt2", 2, 8, 64, T, 4096);
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // (as in PeakRssOfOneStepMatches)
  const Config cfg = config_with("adamw");
  const bool measure = kRssIsTheModels && alone_in_process();
  std::vector<double> predicted_of;
  for (const auto& [tp, sp] : std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {4, false}, {4, true}}) {
    ModelDesc sharded = whole;
    sharded.sequence_parallel = sp;
    const ModelDesc d = tp == 1 ? whole : tensor_shard(sharded, tp, tp - 1);
    const MemoryEstimate e = estimate_memory(d, B, T, cfg, 1, 0, false);
    const double predicted = e.params + e.grads + e.optimizer + e.activations + e.scratch;
    predicted_of.push_back(predicted);
    if (!measure) continue;
    const StepGrowth g = peak_growth_of_one_step(d, Recompute::none, B, T, cfg.train, local_tensor_group);
    const double measured = g.peak;
    if (measured < 0) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
    std::printf("parallel.tp %d%s: memory estimate %.1f MB per rank, measured peak RSS growth %.1f MB (%.2f%%; "
                "allowed +%.1f / -%.1f MB)\n", tp, sp ? " (sequence parallel)" : "", predicted / 1e6, measured / 1e6,
                100.0 * (measured - predicted) / predicted, g.above / 1e6, g.below / 1e6);
    // Neither exact nor a rounding bound: StepGrowth's allowances, as in PeakRssOfOneStepMatches.
    EXPECT_LE(measured, predicted + g.above) << "tp " << tp;
    EXPECT_GE(measured, predicted - g.below) << "tp " << tp;
  }
  EXPECT_LT(predicted_of[1], predicted_of[0] * 0.75);
  EXPECT_LT(predicted_of[2], predicted_of[0] * 0.5);
  EXPECT_LT(predicted_of[3], predicted_of[2]);
  if (!kRssIsTheModels) GTEST_SKIP() << kRssSkip;
  if (!measure) GTEST_SKIP() << kNotAlone;
}
