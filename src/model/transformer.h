// The shared transformer core: one decoder/encoder stack for every family of model_desc.h, run
// over a backend's Ops (fp32; the dense layers' GEMMs in the Model's `precision`, fp32 | tf32 |
// bf16: backend/gemm_precision.h — weights, gradients and every other op stay fp32).
//
//   embedding  x0 = [LN_emb]( wte[tokens] + [wpe[t]] + [tte[types]] ), dropout
//   block l    pre-norm  (gpt2, llama):  x = x + drop(attn(N1(x)));   x = x + drop(mlp(N2(x)))
//              post-norm (bert):         x = LN1(x + drop(attn(x)));  x = LN2(x + drop(mlp(x)))
//              attn(h) = O( attention( rope?( QKV h ) ) )     mlp(h) = P( act( F h ) )
//              attention: full (P stored per layer) or fused (lse per row), by desc.attention
//   head       LM:          logits = N_f(x) · W^T (W = wte when tied, else lm_head); mean CE over positions
//              classifier:  logits = C · drop(tanh(Pool · x[:, 0])); mean CE over sequences
//
// A Model holds a contiguous part of the stack — embedding?, blocks [l0, l1), head? — with its own
// flat parameter and gradient buffers (params/param_table.h; the table in backward order). The
// whole model is the part with everything. Forward and backward are decomposed into the three
// stages, each callable alone with hidden states in and out, so a pipeline stage runs the very
// same code as the whole model; a model cut at any layer initialises exactly like the whole one
// (initial values are keyed by tensor name).
//
// Activations live outside the model, in one Activations per micro-batch in flight: a pipeline
// schedule keeps several; plain data parallelism one. Backward scratch lives in the Model (one
// backward runs at a time).
//
// Gradient convention: backward ADDS into the model's grads (zero_grads() once per step), so
// micro-batches accumulate. grads_ready(k) is called whenever the gradient prefix [0, k) of the
// flat buffer is final (derived from the table: see GradReadyTracker), ending with k = numel.
//
// Split backward (zero-bubble pipelines): a backward begun with BackwardMode::input_only computes
// what flows to the previous layers — the hidden-state gradient, and on the way the norms'
// parameter gradients — but not the weight and bias gradients of the dense layers
// (dW = dout^T · inp, db = Σ dout: half of a dense layer's backward FLOPs), nor the embedding's
// backward (nothing flows below it: weight_backward runs all of it last, from the kept
// a.dresidual, so a tied wte receives the head's and the embedding's gradients in the whole
// backward's order — the same bits at any shape). For each dense layer
// it records in the Activations the layer's input (an activation, kept anyway) and its output
// gradient, in the Activations' `input_only.kept` buffer (written there directly, or copied from the
// backward's scratch, which the next layer reuses). weight_backward(a) later adds those
// gradients; the two together add exactly what one whole backward adds, bit for bit (the same
// GEMMs on the same operands). The gradient-ready calls come from weight_backward: a tensor is
// final only after its weight gradient.
//
// Chunked LM head: the N x V logits (13.2 GB fp32 for GPT-2 at B = 64, T = 1024) are never stored.
// The rows go through the head in chunks of R = lm_head_chunk_rows(desc, N) (model_desc.h; one
// chunk's logits within kLmHeadChunkBytes), one buffer of R rows in the Activations (rows of
// lm_logits_row_stride(V) values, a multiple of 64: Activations::logits_ld). Forward: per
// chunk logits = xf·W^T and softmax_xent (with need_grad its gradient too), keeping only the
// per-row losses — and, in the buffer, the last chunk's logits gradient. Backward runs the chunks
// last to first: the last one's gradient is still in the buffer, every other chunk's logits are
// RECOMPUTED from xf (the final-norm output, an activation anyway) and turned into d loss/d logits
// by the same softmax_xent (the same bits: the same ops on the same operands); then
// dxf_chunk += dlogits·W and dW += dlogits^T·xf_chunk. The price is (chunks - 1) more head GEMMs
// over chunk rows: none with one chunk (the unchunked head's ops and speed), up to the head's
// FLOPs x 4/3 with many. The default because forward and backward stay separate: the split
// backward's contract holds unchanged — an input-only pass adds only dxf, and weight_backward
// recomputes the chunks' gradients again for dW (with one chunk, the buffer still holds it), so a
// zb-h1 head keeps no N x V either; the chunk order is the same as a whole backward's, hence the
// same bits. Where forward and backward do follow each other, the trainer fuses instead ("Fused
// LM head" below). The loss and dxf are per-row work; dW is a sum over chunks (a split of the
// GEMM's reduction over rows), so it differs from one big GEMM in rounding only (and
// the BLAS may round a row differently within another row count: test_lm_head_chunked.cpp).
// Activations::all_logits asks for one chunk of all N rows, so a.logits holds every row's logits
// after a forward (generation without a KV cache).
//
// Fused LM head: a caller whose training forward will be followed by the whole backward of the
// same Activations (the trainer's single-model step, bench-gpu_gpt2, and the pipeline schedules
// but zb-h1) runs the head in HeadMode::fused instead. Its head runs each chunk's
// backward as soon as the chunk's logits gradient exists — chunks last to first, dxf_c +=
// dlogits·W into the Activations' forward scratch `tmp` (free once the blocks are done) and dW +=
// dlogits^T·xf_c into the gradient — so no chunk is recomputed: the same ops on the same operands
// in the same order as lm_head_backward_chunks, hence the same bits (test_lm_head_chunked.cpp),
// and head_backward goes straight on to the final norm. The head weight's gradient is added
// during the forward (backward still adds: zero_grads comes before the forward), and d xf waits
// in the Activations, so other micro-batches may run between. Not for an input-only backward
// (its contract defers dW: zb-h1 keeps the recompute); no extra memory.
//
// bf16 weight copy: with precision bf16 the Model keeps the bits of its parameters rounded to
// bf16 (2 bytes per parameter, the flat buffer's layout). Each forward rounds every dense weight
// it uses once (bf16_copy) just before its first GEMM and hands the copy to the dense-layer
// ops (GemmMode::weight_bf16); the backward of that forward reads the same copy for dinp = dout·W
// (and the chunked LM head's recomputed logits), so the head weight is rounded once per forward
// instead of twice per chunk. The bits are those of rounding in every op; the contract is that the
// parameters do not change between a forward and its backward (an optimizer step comes after the
// backward, and the next forward rounds again). Operands whose producers write them in bf16 too
// (Activations::bf16_operands): the LM head's logits gradient (softmax_xent_bf16_grad into
// Activations::logits_grad_bf16, rows padded to a multiple of 8; GemmMode::dout_bf16) and, in a
// pre-norm model, the norms' outputs (the norm ops' out_bf16; GemmMode::inp_bf16), and the MLP's
// activation output (GELU, erf GELU or SwiGLU), which only GEMMs read and which are then kept only
// in bf16 (half their memory). Each GEMM reads them as
// they are: no fp32 copy written and read back, no conversion pass; again the same bits.
//
// Activation recomputation (Model::recompute, runtime.recompute): which of a block's activations
// the Activations keep per layer, and which backward recomputes from the kept ones. A recomputed
// tensor has one buffer shared by every block of the Activations (it holds one block's values at a
// time: Activations::shared_layer says whose), so the memory of the per-layer tensors falls:
//   none        every tensor per layer
//   selective   the cheap, memory-heavy ones are shared and recomputed per block at the start of
//               its backward: the MLP's activation output act (from fc), full attention's
//               probabilities att (attention_forward again from the kept qkv; its output goes to
//               the free forward scratch tmp), and in a pre-norm block the norms' outputs norm1,
//               norm2 (from x and res_attn, with the kept mean/rstd rewritten with the same bits)
//   full        only each block's output (the next block's input) is kept; backward runs the
//               block's forward again (blocks_forward of that one block) before its backward
// A block whose tensors the shared buffers still hold (the last one after a forward) is not
// recomputed. The recomputing ops are the forward's ops on the forward's operands, with the same
// dropout keys, so the loss and every gradient are the bits of `none` (tests/test_recompute.cpp).
// One exception, by rounding only: selective on CUDA in fp32/tf32 with GELU (tanh), whose forward
// takes act from cuBLASLt's epilogue (matmul_gelu_forward) and whose recompute from gelu_forward. An input-only backward (zb-h1) is refused with recomputation: the dense layers'
// deferred weight gradients would read shared buffers (runtime/options.h recompute_schedule_error).
//
// Tensor parallelism (desc.tp = T > 1, parallel.tp; Shoeybi et al. 2019): the T ranks of a tensor-
// parallel group each hold a shard of every block (desc from tensor_shard, model_desc.h; the table's
// slices say which part of each whole tensor they hold, params/param_table.h) and run the same
// batch:
//   attention  QKV column-parallel (this rank's n_head/T query and n_kv_head/T key/value heads),
//              attention on those heads, the output projection row-parallel (its input columns of
//              those heads): each rank's partial [N, C] output — the bias added on rank 0 only —
//              summed over the group (TensorGroup::sum) before dropout and the residual add
//   MLP        the first projection column-parallel (ffn_dim/T channels; both halves of SwiGLU), the
//              activation on them, the second row-parallel, summed as above
//   backward   d h of each column-parallel layer (QKV, the MLP's first) is each rank's share, summed
//              over the group before it joins the residual stream; the row-parallel layers' input
//              gradients are local. Everything else (norms, residuals, the output biases, the
//              positions, the classifier head) is whole and computed alike on every rank, so its
//              gradients are the same on every rank
//   embedding  the token embedding's vocabulary rows [vocab_begin, vocab_end): each rank looks up the
//              tokens it holds (0 for the others, the positions added on rank 0), summed over the
//              group; backward adds into its rows only
//   LM head    the same rows: each rank's logits [N, V/T] (chunked as above); the cross-entropy
//              across the shards without gathering them (lm_xent: the row maxima's max over the
//              group, then one sum of Σ exp and of the target's logit); d xf summed over the group
// Per block that is one sum of N x C floats in forward and one in backward per branch (the
// embedding and the head one each). Every rank of the group calls the same collectives in the same
// order. Hidden dropout masks are the same on every rank of the group; attention-probability masks
// are drawn per shard (attn_drop_key). Loss and gradients equal T = 1's up to the rounding of the
// sums (tests/test_mpi_tensor_parallel.cpp).
//
// Sequence parallelism (desc.sequence_parallel with T > 1, Korthikanti et al. 2022): the residual
// stream — each block's input and output, res_attn, the norms' outputs and statistics, hidden
// dropout, a.input and a.dresidual — holds only this rank's Nr = N/T rows (rows [r·Nr, (r+1)·Nr)
// of the micro-batch; desc.residual_rows). A branch input (a norm's output, or BERT's block input)
// is all-gathered into a.gathered before its column-parallel GEMM; the row-parallel output in a.tmp
// is reduce-scattered into a.scattered instead of summed; in backward the gradient of that output
// is all-gathered, the branch input gathered again for the weight gradient (nothing N x C is kept
// per layer), and the column-parallel input gradient reduce-scattered onto the rows. The norms'
// weight gradients of each call come from this rank's rows only, so they are summed over the group
// before they are added (norm_backward_rows). The embedding reduce-scatters its partial lookup (the
// positions and token types from rank 0); the LM head all-gathers xf once (a.gathered holds it
// until head_backward) and reduce-scatters d xf; the classifier head gathers its first rows. The
// same collective volume as without it, and the per-layer N x C tensors divided by T. Each rank
// draws the hidden dropout masks of its rows from its own stream (hidden_drop_key). An input-only
// backward (zb-h1) is refused with it: its deferred weight gradients would read the shared
// a.gathered.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/step_scalars.h"
#include "model/model_desc.h"
#include "model/parallel_regions.h"
#include "params/param_table.h"
#include "runtime/group_collectives.h"

namespace llmpi {

// Which part of the stack a Model holds.
struct ModelPart {
  int l0 = 0, l1 = -1;   // blocks [l0, l1); l1 = -1 means n_layer
  bool embedding = true;
  bool head = true;
  static ModelPart whole() { return {}; }
};

// The parameter table of a part of the model described by d (backward order; see above). A
// part with the LM head of a tied-embedding model holds its own copy of the token embedding.
// Checks d first (check_model_sizes: an Error naming the key, before anything is built); time and
// memory linear in the number of tensors.
ParamTable build_param_table(const ModelDesc& d, const ModelPart& part = ModelPart::whole());

// Pointers into a flat buffer (parameters or gradients), by role; null where the family has none.
struct BlockTensors {
  float* t[kRoleCount] = {};
  float* operator[](int role) const { return t[role]; }
};

// One batch as the data loader reads it (host memory). LM: tokens and targets [B*T].
// Classification: tokens, token_types, attn_mask [B*T] and labels [B].
struct Batch {
  int B = 0, T = 0;
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* token_types = nullptr;
  const int32_t* attn_mask = nullptr;
  const int32_t* labels = nullptr;
};

// What a head forward leaves for head_backward.
enum class HeadMode {
  eval,   // the loss only; no gradient (head_backward may not follow)
  train,  // the loss and its gradient: the chunked LM head keeps the last chunk's logits gradient
          // and head_backward recomputes the others ("Chunked LM head"); any backward may follow,
          // an input-only one too
  fused,  // train, an LM head running its backward inside ("Fused LM head": no logits recomputed,
          // the head weight's gradient added now): only where the whole backward of these
          // activations follows (other passes may run between). A classifier runs as train.
};

// Which gradients a backward computes (see "Split backward" above).
enum class BackwardMode {
  whole,       // every gradient
  input_only,  // all but the dense layers' weight and bias gradients, which weight_backward adds
};

// What keys the dropout masks of one forward (counter-based: backend/dropout_hash.h).
struct DropoutContext {
  bool training = false;  // dropout applies only while training
  uint64_t seed = 0;
  int64_t step = 0;
  int rank = 0, micro_batch = 0;
};

struct Model;


// n floats rounded up to a multiple of 64 (256 bytes): the room one tensor of the Activations takes,
// so that every tensor starts 256-byte aligned — the bf16 GEMM operands among them (the norms' and
// activations' bf16 outputs, the logits gradient) as aligned as the GEMMs' own scratch copies, so
// cuBLAS sees the same alignment with or without them. memory_estimate counts with it too.
inline size_t activation_floats_aligned(size_t n) { return (n + 63) / 64 * 64; }

// The activations of one micro-batch on one Model (backend memory, one allocation).
struct Activations {
  struct Layer {
    float *norm1, *norm1_mean, *norm1_rstd, *qkv, *atty, *att, *res_attn, *norm2, *norm2_mean, *norm2_rstd,
        *fc, *act, *res_mlp, *out;
    // A bf16 pre-norm model (bf16_operands): the norms' outputs, inputs of the QKV and MLP GEMMs
    // only, are kept only in bf16 [N, C] here, and norm1 / norm2 are null; null otherwise. The
    // same for the MLP's activation output act [N, F] (input of its output projection only) in
    // every bf16 model (bf16_operands).
    uint16_t *norm1_bf16, *norm2_bf16, *act_bf16;
    // Attention's saved state: att [B, NH, T, T] (full attention) or lse [B, NH, T] (fused);
    // the other is null (model_desc.h AttentionImpl).
    float* lse;
  };
  const Model* model = nullptr;
  int B = 0, T = 0;
  AttentionImpl attention = AttentionImpl::full;  // the model's when allocated (re-allocated on a change)
  DropoutContext dropout;
  // Ids on the device: tokens, targets (LM) or labels (classifier), token types, attention mask.
  int32_t *tokens = nullptr, *targets = nullptr, *token_types = nullptr, *attn_mask = nullptr;
  // (the residual stream's tensors hold Nr rows of C with sequence parallelism: see above)
  float* input = nullptr;     // [N, C] the hidden state entering block l0 (embedding output, or handed in)
  float* emb_sum = nullptr;   // [N, C] embedding sum before its LayerNorm (BERT)
  float *emb_mean = nullptr, *emb_rstd = nullptr;
  std::vector<Layer> layers;  // blocks l0 .. l1-1
  float *final_norm = nullptr, *final_mean = nullptr, *final_rstd = nullptr;
  uint16_t* final_norm_bf16 = nullptr;  // the same for the final norm (final_norm null then)
  // Set before allocation: with a bf16 Model, the operands its producers can write in bf16 are
  // kept so (the pre-norm blocks' and the final norm's outputs, the LM head's logits gradient:
  // "bf16 weight copy" in the header comment). false: every activation in fp32 and every GEMM
  // rounding its operands itself (the tests' reference path).
  bool bf16_operands = true;
  // Classifier: [B, classes]; after a training forward d loss / d logits. LM head: the chunk
  // buffer [lm_rows, logits_ld] (see "Chunked LM head"), after a forward the last chunk's logits
  // (all rows' with all_logits; with need_grad their gradient).
  float* logits = nullptr;
  // A bf16 Model's LM head (not all_logits): the chunk's logits gradient as bf16, [lm_rows,
  // logits_ld], the head's GEMM operand, written by softmax_xent_bf16_grad instead of over
  // `logits` ("bf16 weight copy" above); null otherwise. Where it exists, it and not `logits`
  // holds the gradient head_pass.last_chunk_grad speaks of.
  uint16_t* logits_grad_bf16 = nullptr;
  // The row stride of `logits` and `logits_grad_bf16`: the LM head's chunk buffer pads its rows
  // to lm_logits_row_stride(V) (a multiple of 64 values; model_desc.h), so that the head's GEMMs
  // see 256-byte aligned rows; with all_logits (whose readers want [N, V]) and in the classifier
  // it is the row width itself.
  int logits_ld = 0;
  float* losses = nullptr;    // [rows]
  float* xent_stats = nullptr; // tensor parallelism's LM head: [3, lm_rows] row maxima, Σ exp, target logits
  bool all_logits = false;    // set before allocation: the LM head keeps every row's logits
  int lm_rows = 0;            // rows of the LM head's chunk buffer
  // The last head forward, which head_backward follows: its mode (fused only for an LM head, a
  // classifier records train; after fused, tmp holds d xf) and loss-gradient scale, and whether
  // the LM head's chunk buffer holds the last chunk's logits gradient (the chunked backward then
  // starts from it instead of recomputing that chunk).
  struct HeadPass {
    HeadMode mode = HeadMode::eval;
    float grad_scale = 0;
    bool last_chunk_grad = false;
  } head_pass;
  float *cls = nullptr, *pooled_pre = nullptr, *pooled = nullptr, *pooled_drop = nullptr;  // classifier
  float* dresidual = nullptr; // [N, C] the gradient flowing down the residual stream
  float* tmp = nullptr;       // [N, C] forward scratch (a branch's output before the residual add); after a
                              // forward with a fused LM head, d loss / d xf until head_backward
  // Sequence parallelism (null otherwise): a branch input all-gathered [N, C] — in forward the
  // GEMMs' input (after the blocks the final norm's output, the LM head's xf), in backward the
  // same gathered again — and a branch output reduce-scattered to this rank's rows [Nr, C].
  float *gathered = nullptr, *scattered = nullptr;
  bool has_mask = false;      // the batch carried an attention mask
  // The block whose recomputed tensors ("Activation recomputation" above) the shared buffers hold
  // now, or -1 (none, or not known).
  int shared_layer = -1;
  std::vector<float> losses_host;  // per-row losses, after a forward that reads the loss back
  // The scalars a training step reads back in one copy (backend memory, backend/step_scalars.h):
  // the head's loss sum and first bad target (head_forward), the gradient's sum of squares
  // (the trainer's clip).
  StepScalars* scalars = nullptr;

  // The deferred half of an input-only backward (Model::weight_backward): per dense layer, in
  // backward order, the gradient it owes and the operands — the layer's input (an activation
  // above, or logits) and its output gradient (in `input_only.kept`, unless it is an activation already).
  struct DeferredDense {
    int slot, weight_role, bias_role;  // Model::role_slices slot; bias_role -1: the layer has none
    const float* dout;                 // [N, OC]; null: the chunked LM head (recomputed)
    const float* inp;                  // [N, C] (null when kept only in bf16)
    const uint16_t* inp16;             // its bf16 copy, or null
    int N, C, OC;
  };
  struct InputOnlyPass {
    std::vector<DeferredDense> deferred;
    bool embed_deferred = false;  // the embedding's backward waits for weight_backward too
    bool pending = false;         // an input-only backward ran; weight_backward has not
    float* kept = nullptr;        // backend memory for the output gradients (kept_floats)
    size_t kept_floats = 0, kept_used = 0;
  } input_only;
  // Allocates `floats` for input_only.kept (once; counted in bytes()). Model::reserve_input_only
  // sizes it.
  void reserve_kept(size_t floats);

  Activations() = default;
  Activations(const Model& m, int B, int T) { allocate(m, B, T); }
  ~Activations();
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;
  void allocate(const Model& m, int B, int T);
  // The hidden state leaving the last block of the part (= input when the part has no blocks).
  float* output() const { return layers.empty() ? input : layers.back().out; }
  size_t bytes() const { return bytes_; }

 private:
  bool bf16_planned_ = false;  // the bf16_operands this allocation made
  Recompute recompute_planned_ = Recompute::none;  // the model's recompute this allocation laid out
  float* mem_ = nullptr;
  int32_t* ids_ = nullptr;
  size_t bytes_ = 0;
};

// Which of the model's flat buffers are host memory resident only where written
// (backend/host_pages.h) instead of allocated whole: none, the gradient (ZeRO-2), or the gradient
// and the parameters (ZeRO-3; comm/grad_sync.h). On a GPU backend only the gradient, as device
// pages (backend/cuda_ops.h "Device pages"): address space the sync backs before backward writes.
enum class PagedBuffers { none, grads, grads_and_params };

struct Model {
  ModelDesc desc;
  ModelPart part;
  const Ops* ops;
  GemmPrecision precision;  // of the dense layers' GEMMs (tf32 only on a GPU backend)
  // Which activations backward recomputes ("Activation recomputation" above); Activations
  // allocated before a change are laid out again by the next load_batch.
  Recompute recompute = Recompute::none;
  ParamTable table;
  // With desc.tp > 1 ("Tensor parallelism" above): the group's collectives, set before the first forward.
  TensorGroup tensor;
  float* params = nullptr;  // table.numel floats, backend memory
  float* grads = nullptr;   // same layout
  // PagedBuffers (ZeRO-2/3): grads (and params) resident only where written (CPU) or backed (GPU);
  // on the CPU zero_grads gives the gradient's pages back, on a GPU the sync zeroes its pieces.
  PagedBuffers paged = PagedBuffers::none;
  BlockTensors pe, ge;                 // embedding and head tensors (parameters, gradients)
  std::vector<BlockTensors> pb, gb;    // blocks l0 .. l1-1
  // role_slices[slot][role]: the table indices of a role's tensor(s); slot 0 = embedding and
  // head, slot 1 + i = local block i.
  std::vector<std::vector<std::vector<int>>> role_slices;

  // Paged buffers on a GPU are device pages (backend/cuda_ops.h), unbacked until the sync backs
  // them: the parameters are written by GradSync::load_params, not init_params.
  Model(const ModelDesc& d, const Ops& ops, const ModelPart& part = ModelPart::whole(),
        GemmPrecision precision = GemmPrecision::fp32, Recompute recompute = Recompute::none,
        PagedBuffers paged = PagedBuffers::none);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  int l0() const { return part.l0; }
  int l1() const { return part.l1; }
  int rows_for_loss(int B, int T) const { return desc.head == HeadKind::lm ? B * T : B; }

  // Initial values of every tensor from (seed): see params/param_table.h. Every rank gets the same.
  void init_params(uint64_t seed);
  void zero_grads();
  // Parameters and gradients as host copies (tests, checkpoints).
  std::vector<float> params_host() const;
  std::vector<float> grads_host() const;

  // ---- the three stages (forward) ----
  // Copy the batch's ids to the device (every stage that needs them calls this first), after
  // checking them on the host; no host wait (copy_to_device_async: the batch may be reused at once).
  void load_batch(Activations& a, const Batch& b) const;
  void embed_forward(Activations& a) const;                 // a.input = x0
  void blocks_forward(Activations& a, int from, int to) const;  // blocks [from, to) ⊆ [l0, l1)
  // The head's forward, in `mode` (HeadMode above), queued: nothing read back (no host wait on
  // a GPU). The per-row losses stay in a.losses, their sum (double) goes to a.scalars->loss_sum
  // and an out-of-range target is recorded in a.scalars->bad_target (softmax_xent_record). With
  // a training mode the loss gradient is scaled by grad_scale, which lets a caller average over
  // more rows than this batch holds (1 = the mean over this batch).
  void head_forward(Activations& a, HeadMode mode, float grad_scale = 1.0f) const;
  // The mean loss of the last head forward over this batch's rows: read_scalars (one host wait
  // on a GPU; the target check), the per-row losses copied to a.losses_host and summed there in
  // double.
  float read_loss(Activations& a) const;
  // a.scalars in one copy (a host wait on a GPU); throws softmax_xent's error, naming the target
  // and row, when the last forward recorded one out of range.
  StepScalars read_scalars(const Activations& a) const;
  // The mean loss from scalars read after head_forward: (float)(loss_sum / rows), the value
  // read_loss returns (the same bits on the CPU, where both sum in row order).
  float loss_of(const StepScalars& s, const Activations& a) const;

  // ---- and backward, in reverse; a.dresidual carries the hidden-state gradient between them ----
  using ReadyFn = std::function<void(size_t)>;
  // A backward pass is begin_backward, then head_backward?, blocks_backward, embed_backward? on
  // one Activations; one pass runs to its end before the next begins.
  void begin_backward();                                     // a whole pass: resets the gradient-ready tracking
  // input_only: the pass records its dense layers' weight gradients in a (ready is not called)
  void begin_backward(Activations& a, BackwardMode mode);
  void head_backward(Activations& a, const ReadyFn& ready);  // a.dresidual = d loss / d output
  void blocks_backward(Activations& a, int from, int to, const ReadyFn& ready);  // to > from, runs to-1 .. from
  void embed_backward(Activations& a, const ReadyFn& ready);
  // After an input-only pass on a (other passes may run in between): adds the deferred weight
  // and bias gradients, in backward order, and reports readiness as a whole backward does — every
  // tensor without a deferred gradient is final at once (all of its backward ran). So ready may
  // be given only to the step's last weight_backward, after every other backward of the step.
  void weight_backward(Activations& a, const ReadyFn& ready);
  // Floats an input-only backward keeps per micro-batch of B x T, and their allocation in a
  // (call once per Activations to have the memory counted up front; the pass allocates it anyway).
  size_t kept_floats(int B, int T) const;
  void reserve_input_only(Activations& a) const { a.reserve_kept(kept_floats(a.B, a.T)); }

  // ---- the whole part: load_batch and the stages it holds ----
  // Queued: nothing read back (the trainer reads the loss at the step's one readback,
  // read_scalars, with the gradient's sum of squares).
  void forward_queued(Activations& a, const Batch& b, HeadMode mode, float grad_scale = 1.0f) const;
  // ... and the loss read back (read_loss; 0 for a part without the head).
  float forward(Activations& a, const Batch& b, HeadMode mode, float grad_scale = 1.0f) const;
  void backward(Activations& a, const ReadyFn& grads_ready = {});

  // Classifier: argmax of each sequence's logits after a forward without gradient.
  std::vector<int> predictions(const Activations& a) const;

 private:
  GradReadyTracker tracker_;
  BackwardMode mode_ = BackwardMode::whole;
  // The bf16 weight copy ("bf16 weight copy" above; null unless precision is bf16), and the GEMM
  // mode of a dense layer whose weight w (n floats, a tensor of params) the forward rounds into it
  // now, or the backward reads as the forward rounded it. Plain `precision` when there is no copy.
  // Its layout: aligned_copy_layout (params/param_table.h), each tensor 256-byte aligned.
  uint16_t* weights_bf16_ = nullptr;
  std::vector<size_t> copy_offsets_;  // per slice of `table`: its first value in weights_bf16_
  uint16_t* copy_of(const float* w) const;  // where the tensor at w (in params) has its bf16 copy
  GemmMode gemm_rounding(const float* w, size_t n) const;
  GemmMode gemm_reading(const float* w) const;
  const Activations* input_only_pass_ = nullptr;  // the Activations of the input-only pass running
  // Backward scratch, grown on demand.
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;
  float *d_a_ = nullptr, *d_b_ = nullptr, *d_qkv_ = nullptr, *d_fc_ = nullptr, *d_act_ = nullptr,
        *d_att_ = nullptr, *d_small_ = nullptr;
  float *d_full_ = nullptr, *d_norm_ = nullptr;  // sequence parallelism: [N, C] gathered gradient, [2, C]
  void ensure_scratch(int B, int T);
  void check_block_range(int from, int to) const;  // [from, to) within [l0, l1), else an internal error
  void finished(int slot, std::initializer_list<int> roles, const ReadyFn& ready);  // no-op in an input-only pass
  // A dense layer's backward: dinp += dout · W now (dinp may be null); dW += dout^T · inp and
  // db += Σ dout now (reported finished when `last`: no other contribution in this pass) or, in
  // an input-only pass, recorded in a (dout copied unless dout_kept: it lives in a already).
  // inp16: the input in bf16 where it is kept so (inp null then).
  void dense_backward(Activations& a, float* dinp, const float* dout, bool dout_kept, const float* inp,
                      const uint16_t* inp16, int slot, int weight_role, int bias_role, int N, int C, int OC, bool last,
                      const ReadyFn& ready);
  float* kept_buffer(Activations& a, size_t n) const;  // the next n floats of a.input_only.kept
  // The tensor/sequence-parallel hand-offs of this shard for a's rows (model/parallel_regions.h).
  ParallelRegions regions(const Activations& a) const;

  // ---- the sublayers, forward beside backward (model/layers/*.cpp); block.cpp composes them ----
  // A branch forward reads its input h on the residual stream's rows (h16: kept only in bf16,
  // h null then) and returns its output on those rows, dropout applied (in a.tmp or a.scattered).
  const float* attention_forward(Activations& a, int l, const float* h, const uint16_t* h16) const;
  const float* mlp_forward(Activations& a, int l, const float* h, const uint16_t* h16) const;
  // Selective recomputation: the tensors the shared buffers hold for block l, again.
  void attention_recompute(Activations& a, int l) const;  // full attention's P (its output into a.tmp)
  void mlp_recompute(Activations& a, int l) const;        // the activation output, from the kept fc
  // One block's backward in progress: which block, and where its dense layers' output gradients
  // go (scratch, or in an input-only pass the kept buffers weight_backward reads).
  struct BlockPass {
    int l, slot;
    float *d_fc, *d_qkv;
    const ReadyFn& ready;
  };
  // A block's dense layer inp [N, in] -> [N, out], backward (dense_backward; dout kept when it is
  // the pass's d_fc or d_qkv).
  void block_dense(Activations& a, const BlockPass& p, float* dinp, const float* dout, const float* inp,
                   const uint16_t* inp16, int weight_role, int bias_role, int in, int out);
  // Where a branch backward leaves its input's gradient (ParallelRegions::enter_column_backward).
  struct InputGrad {
    float *part, *rows, *acc;
  };
  // A branch backward from dout = d(branch output before dropout) on the residual stream's rows;
  // h / h16 the branch input as the forward read it. Returns d h on the rows (ig.acc when given).
  const float* attention_backward(Activations& a, const BlockPass& p, const float* dout, const float* h,
                                  const uint16_t* h16, InputGrad ig);
  const float* mlp_backward(Activations& a, const BlockPass& p, const float* dout, const float* h,
                            const uint16_t* h16, InputGrad ig);
  // The row-parallel GEMM's output in a.tmp onto the residual stream's rows, hidden dropout at
  // `site` applied (block.cpp).
  const float* branch_output(Activations& a, int l, int site) const;
  // One block's forward, by norm placement (block.cpp).
  void block_forward_pre_norm(Activations& a, int l) const;
  void block_forward_post_norm(Activations& a, int l) const;
  // Block l's recomputed tensors into the shared buffers of a, unless they hold them already.
  void recompute_block(Activations& a, int l) const;
  void block_backward_pre_norm(Activations& a, const BlockPass& p);
  void block_backward_post_norm(Activations& a, const BlockPass& p);
  // A norm's backward over `rows` rows of the residual stream (adds into dx, dw, db). With
  // sequence parallelism the rows are this rank's: the weight gradients of the call are summed
  // over the group (in d_norm_) before they are added, so they stay the same on every rank.
  void norm_backward_rows(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                          const float* mean, const float* rstd, int rows);
  // The heads (layers/lm_head.cpp, layers/classifier.cpp); head_forward and head_backward
  // choose by desc.head.
  void lm_head_forward(Activations& a, bool need_grad, float grad_scale, bool fused) const;
  void classifier_forward(Activations& a, bool need_grad, float grad_scale) const;
  void lm_head_backward(Activations& a, const ReadyFn& ready);
  void classifier_backward(Activations& a, const ReadyFn& ready);
  // The chunked LM head's backward ("Chunked LM head"): per chunk, logits recomputed from xf and
  // turned into their gradient; then dxf += dlogits·W (dxf may be null) and dW += dlogits^T·xf
  // (dW may be null).
  void lm_head_backward_chunks(Activations& a, float* dxf, float* dW) const;
  // The cross-entropy of LM head chunk rows [r0, r0 + rn) from its logits in a.logits: the losses,
  // and with scale != 0 the gradient scale · (softmax - onehot) (over the group's shards with
  // tensor parallelism).
  void lm_xent(Activations& a, int r0, int rn, float scale) const;
};

}  // namespace llmpi
