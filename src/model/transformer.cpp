// The Model: its parameters and their bf16 copy, the three stages' entry points, and the
// backward pass's bookkeeping (gradient readiness, the input-only pass's deferred weight
// gradients). The sublayers are in model/layers/, the blocks that wire them in block.cpp, the
// parameter table in param_layout.cpp, the activations' layout in activations.cpp.
#include "model/transformer.h"

#include <algorithm>

#include "backend/cuda_ops.h"
#include "backend/host_pages.h"
#include "model/activation_plan.h"

#include "runtime/error.h"

namespace llmpi {

// ---- the model ------------------------------------------------------------------------------------

Model::Model(const ModelDesc& d, const Ops& o, const ModelPart& p, GemmPrecision prec, Recompute rc, PagedBuffers pg)
    : desc(d), part(p), ops(&o), precision(prec), recompute(rc), paged(pg) {
  if (part.l1 < 0) part.l1 = d.n_layer;
  if (prec == GemmPrecision::tf32 && !o.on_gpu())
    fail("runtime.precision \"tf32\" is a CUDA tensor-core mode; use \"fp32\" or \"bf16\" on the CPU");
  if (d.n_layer < 1 || d.n_head < 1 || d.d_model % d.n_head != 0 || d.n_kv_head < 1 || d.n_head % d.n_kv_head != 0)
    fail("model: inconsistent shape (n_layer ", d.n_layer, ", n_head ", d.n_head, ", n_kv_head ", d.n_kv_head,
         ", d_model ", d.d_model, ")");
  if (d.head == HeadKind::classifier && d.num_labels < 1) fail("model: a classifier needs model.num_labels >= 1");
  table = build_param_table(d, part);
  const size_t bytes = table.numel * sizeof(float);
  // Paged parameters on a GPU: address space the sync backs and writes where it keeps them
  // (comm/grad_sync.h, ZeRO-3 on a GPU): init_params leaves them to GradSync::load_params.
  params = static_cast<float*>(paged != PagedBuffers::grads_and_params ? ops->alloc(bytes)
                               : o.on_gpu()                            ? cuda_pages_reserve(bytes)
                                                                       : host_pages_alloc(bytes));
  // Paged gradients on a GPU: address space the sync backs as it needs (cuda_ops.h "Device pages").
  grads = static_cast<float*>(paged == PagedBuffers::none ? ops->alloc(bytes)
                              : o.on_gpu()                ? cuda_pages_reserve(bytes)
                                                          : host_pages_alloc(bytes));
  if (precision == GemmPrecision::bf16)
    weights_bf16_ = static_cast<uint16_t*>(ops->alloc(aligned_copy_layout(table, &copy_offsets_) * sizeof(uint16_t)));
  const int nl = part.l1 - part.l0;
  pb.resize(nl);
  gb.resize(nl);
  role_slices.assign(1 + nl, std::vector<std::vector<int>>(kRoleCount));
  for (size_t i = 0; i < table.slices.size(); i++) {
    const ParamSlice& s = table.slices[i];
    const int slot = s.layer < 0 ? 0 : 1 + s.layer - part.l0;
    std::vector<int>& list = role_slices[slot][s.role];
    if (!list.empty() && list.back() != static_cast<int>(i) - 1)
      fail("internal: the parts of ", role_name(s.role), " are not adjacent in the table");
    list.push_back(static_cast<int>(i));
    if (list.size() > 1) continue;  // a fused tensor is addressed by its first part
    BlockTensors& pt = slot == 0 ? pe : pb[slot - 1];
    BlockTensors& gt = slot == 0 ? ge : gb[slot - 1];
    pt.t[s.role] = params + s.offset;
    gt.t[s.role] = grads + s.offset;
  }
  tracker_.reset(table);
}

Model::~Model() {
  if (paged != PagedBuffers::grads_and_params) ops->free(params);
  else if (ops->on_gpu()) cuda_pages_free(params);
  else host_pages_free(params, table.numel * sizeof(float));
  if (paged == PagedBuffers::none) ops->free(grads);
  else if (ops->on_gpu()) cuda_pages_free(grads);
  else host_pages_free(grads, table.numel * sizeof(float));
  ops->free(weights_bf16_);
  ops->free(scratch_);
}

uint16_t* Model::copy_of(const float* w) const {
  const size_t o = static_cast<size_t>(w - params);
  // the slice holding offset o: the last one starting at or before it
  const auto it = std::upper_bound(table.slices.begin(), table.slices.end(), o,
                                   [](size_t x, const ParamSlice& s) { return x < s.offset; });
  if (w < params || o >= table.numel || it == table.slices.begin())
    fail("internal: a bf16 weight copy asked for a pointer outside the parameters");
  const size_t i = static_cast<size_t>(it - table.slices.begin()) - 1;
  return weights_bf16_ + copy_offsets_[i] + (o - table.slices[i].offset);
}

// (a tensor of several slices — BERT's QKV — is contiguous in the copy as in params)
GemmMode Model::gemm_rounding(const float* w, size_t n) const {
  if (weights_bf16_ == nullptr) return precision;
  uint16_t* copy = copy_of(w);
  ops->bf16_copy(copy, w, n);
  return {precision, copy};
}

GemmMode Model::gemm_reading(const float* w) const {
  if (weights_bf16_ == nullptr) return precision;
  return {precision, copy_of(w)};
}

void Model::init_params(uint64_t seed) {
  if (!ops->on_gpu()) {  // host memory already: no second copy of the parameters, even for a moment
    init_param_values(table, seed, params);
    return;
  }
  if (paged == PagedBuffers::grads_and_params) fail("internal: init_params of paged device parameters");
  std::vector<float> host(table.numel);
  init_param_values(table, seed, host.data());
  ops->copy_to_device(params, host.data(), host.size() * sizeof(float));
}

void Model::zero_grads() {
  // (Paged on a GPU the sync zeroes what it has backed: GradSync::zero_pieces.)
  if (paged != PagedBuffers::none && ops->on_gpu()) fail("internal: zero_grads of paged device gradients");
  if (paged != PagedBuffers::none) host_pages_release(grads, table.numel * sizeof(float));
  else ops->zero(grads, table.numel * sizeof(float));
}

std::vector<float> Model::params_host() const {
  std::vector<float> h(table.numel);
  ops->copy_to_host(h.data(), params, h.size() * sizeof(float));
  return h;
}

std::vector<float> Model::grads_host() const {
  std::vector<float> h(table.numel);
  ops->copy_to_host(h.data(), grads, h.size() * sizeof(float));
  return h;
}

// ---- the stages -------------------------------------------------------------------------------------

namespace {
// Every id that indexes a table is checked on the host before it reaches an op: the embedding
// kernels (CPU and CUDA) read table rows without a bounds check, and on a GPU an id out of range
// is a silent wrong answer or an asynchronous fault reported far from its cause.
void check_ids(const int32_t* ids, size_t n, int limit, const char* what, const char* fix) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= limit)
      fail(what, " ", ids[i], " at position ", i, " of the batch is outside [0, ", limit, "): ", fix);
}
}  // namespace

void Model::load_batch(Activations& a, const Batch& b) const {
  if (desc.tp > 1 && !(tensor.sum && tensor.max))
    fail("internal: a tensor-parallel model without its group's collectives (Model::tensor)");
  a.allocate(*this, b.B, b.T);
  const size_t N = static_cast<size_t>(b.B) * b.T;
  if (!b.tokens) fail("internal: a batch without tokens");
  const char* fix = "the data was made for a larger vocabulary or another tokenizer; set model.vocab_size "
                    "to the tokenizer's size (or leave it 0 to take it from the data)";
  check_ids(b.tokens, N, desc.vocab_size, "token id", fix);
  if (desc.head == HeadKind::lm && b.targets) check_ids(b.targets, N, desc.vocab_size, "target id", fix);
  if (desc.head == HeadKind::classifier && b.labels)
    check_ids(b.labels, static_cast<size_t>(b.B), desc.num_labels, "label",
              "the data has more classes than model.num_labels; raise model.num_labels");
  if (b.token_types)
    check_ids(b.token_types, N, std::max(desc.type_vocab_size, 1), "token type",
              "raise model.type_vocab_size, or make the data without token types");
  // Uploads without a host wait (through the backend's page-locked staging: the batch's buffers
  // may be reused as soon as this returns), ordered before the ops that read them.
  ops->copy_to_device_async(a.tokens, b.tokens, N * sizeof(int32_t));
  if (desc.head == HeadKind::lm && b.targets) ops->copy_to_device_async(a.targets, b.targets, N * sizeof(int32_t));
  if (desc.head == HeadKind::classifier && b.labels)
    ops->copy_to_device_async(a.targets, b.labels, static_cast<size_t>(b.B) * sizeof(int32_t));
  if (b.token_types)
    ops->copy_to_device_async(a.token_types, b.token_types, N * sizeof(int32_t));
  else
    ops->zero(a.token_types, N * sizeof(int32_t));
  a.has_mask = b.attn_mask != nullptr;
  if (b.attn_mask) ops->copy_to_device_async(a.attn_mask, b.attn_mask, N * sizeof(int32_t));
}

void Model::head_forward(Activations& a, HeadMode mode, float grad_scale) const {
  const bool need_grad = mode != HeadMode::eval;
  // (the cross-entropy writes a gradient only for a scale != 0; a backward would read stale logits)
  if (need_grad && grad_scale == 0.0f) fail("internal: a head forward with need_grad and grad_scale 0");
  // Targets outside [0, V) are recorded in a.scalars->bad_target (cleared here, once per forward)
  // and reported by read_scalars: no host wait per chunk.
  ops->zero(&a.scalars->bad_target, sizeof(uint64_t));
  const bool lm = desc.head == HeadKind::lm;
  const bool fused = mode == HeadMode::fused && lm;
  a.head_pass.grad_scale = grad_scale;  // (a fused LM head's backward reads it)
  if (lm)
    lm_head_forward(a, need_grad, grad_scale, fused);
  else
    classifier_forward(a, need_grad, grad_scale);
  a.head_pass.mode = fused ? HeadMode::fused : need_grad ? HeadMode::train : HeadMode::eval;
  // The chunk buffer holds the last chunk's gradient (after a fused head, lm_head_backward_chunks
  // said whether it does: chunk 0's is the last it wrote).
  if (!fused) a.head_pass.last_chunk_grad = need_grad && lm;
  // Σ of the per-row losses in double (on the CPU in row order: the host loop's bits).
  ops->sum_to_double(&a.scalars->loss_sum, a.losses, static_cast<size_t>(rows_for_loss(a.B, a.T)));
}

StepScalars Model::read_scalars(const Activations& a) const {
  StepScalars s;
  ops->copy_to_host(&s, a.scalars, sizeof s);
  if (s.bad_target != 0)  // softmax_xent's message (load_batch checks the ids first: not reached from files)
    fail("softmax_xent: target ", bad_target_value(s.bad_target), " at row ", bad_target_row(s.bad_target),
         " is outside the vocabulary [0, ", desc.head == HeadKind::lm ? desc.vocab_size : desc.num_labels,
         "); check the data set's vocab_size against the model's");
  return s;
}

float Model::loss_of(const StepScalars& s, const Activations& a) const {
  return static_cast<float>(s.loss_sum / rows_for_loss(a.B, a.T));
}

float Model::read_loss(Activations& a) const {
  read_scalars(a);  // the target check
  const int rows = rows_for_loss(a.B, a.T);
  ops->copy_to_host(a.losses_host.data(), a.losses, static_cast<size_t>(rows) * sizeof(float));
  double sum = 0;
  for (int r = 0; r < rows; r++) sum += a.losses_host[r];
  return static_cast<float>(sum / rows);
}

void Model::forward_queued(Activations& a, const Batch& b, HeadMode mode, float grad_scale) const {
  load_batch(a, b);
  if (part.embedding) embed_forward(a);
  blocks_forward(a, part.l0, part.l1);
  if (part.head) head_forward(a, mode, grad_scale);
}

float Model::forward(Activations& a, const Batch& b, HeadMode mode, float grad_scale) const {
  forward_queued(a, b, mode, grad_scale);
  return part.head ? read_loss(a) : 0.0f;
}

std::vector<int> Model::predictions(const Activations& a) const {
  const int rows = rows_for_loss(a.B, a.T), K = desc.head == HeadKind::lm ? desc.vocab_size : desc.num_labels;
  if (desc.head == HeadKind::lm && a.lm_rows < rows)
    fail("internal: predictions of an LM need every row's logits (Activations::all_logits)");
  const size_t ld = static_cast<size_t>(a.logits_ld);  // (>= K: the chunk buffer's padded rows)
  std::vector<float> logits(static_cast<size_t>(rows) * ld);
  ops->copy_to_host(logits.data(), a.logits, logits.size() * sizeof(float));
  std::vector<int> pred(rows);
  for (int r = 0; r < rows; r++) {
    const float* z = logits.data() + r * ld;
    int best = 0;
    for (int k = 1; k < K; k++)
      if (z[k] > z[best]) best = k;
    pred[r] = best;
  }
  return pred;
}

// ---- backward ---------------------------------------------------------------------------------------

// The buffers of plan_backward_scratch (model/activation_plan.h), in its order.
void Model::ensure_scratch(int B, int T) {
  const ScratchPlan plan = plan_backward_scratch(desc, B, T);
  const size_t total = static_cast<size_t>(plan.total());
  if (total > scratch_floats_) {
    ops->free(scratch_);
    scratch_ = static_cast<float*>(ops->alloc(total * sizeof(float)));
    scratch_floats_ = total;
  }
  float** ptrs[kScratchBuffers] = {&d_a_, &d_b_, &d_qkv_, &d_fc_, &d_act_, &d_att_, &d_small_, &d_full_, &d_norm_};
  size_t off = 0;
  for (int i = 0; i < kScratchBuffers; i++) {
    *ptrs[i] = scratch_ + off;
    off += (static_cast<size_t>(plan.floats[i]) + 15) / 16 * 16;
  }
}

namespace {
size_t round16(size_t n) { return (n + 15) / 16 * 16; }  // kept tensors start 64-byte aligned
}  // namespace

void Model::begin_backward() {
  mode_ = BackwardMode::whole;
  input_only_pass_ = nullptr;
  tracker_.reset(table);
}

void Model::begin_backward(Activations& a, BackwardMode mode) {
  if (mode == BackwardMode::whole) return begin_backward();
  if (a.input_only.pending) fail("internal: an input-only backward over activations whose weight_backward has not run");
  mode_ = mode;
  input_only_pass_ = &a;
  reserve_input_only(a);
  a.input_only.deferred.clear();
  a.input_only.embed_deferred = false;
  a.input_only.kept_used = 0;
  a.input_only.pending = true;
}

size_t Model::kept_floats(int B, int T) const {
  return static_cast<size_t>(plan_kept_floats(desc, part, B, T));
}

void Model::finished(int slot, std::initializer_list<int> roles, const ReadyFn& ready) {
  if (mode_ == BackwardMode::input_only) return;  // weight_backward reports
  for (int r : roles)
    if (r >= 0)
      for (int i : role_slices[slot][r]) tracker_.done(static_cast<size_t>(i));
  const size_t k = tracker_.advance();
  if (k && ready) ready(k);
}

void Model::dense_backward(Activations& a, float* dinp, const float* dout, bool dout_kept, const float* inp,
                           const uint16_t* inp16, int slot, int weight_role, int bias_role, int N, int C, int OC,
                           bool last, const ReadyFn& ready) {
  const Ops& o = *ops;
  const BlockTensors& w = slot == 0 ? pe : pb[slot - 1];
  const BlockTensors& g = slot == 0 ? ge : gb[slot - 1];
  float* dbias = bias_role >= 0 ? g[bias_role] : nullptr;
  if (mode_ == BackwardMode::whole) {
    GemmMode gm = gemm_reading(w[weight_role]);
    gm.inp_bf16 = inp16;
    o.matmul_backward(dinp, g[weight_role], dbias, dout, inp, w[weight_role], N, C, OC, gm);
    if (last) finished(slot, {weight_role, bias_role}, ready);
    return;
  }
  if (input_only_pass_ != &a) fail("internal: an input-only backward continued on other activations");
  if (dinp) o.matmul_backward(dinp, nullptr, nullptr, dout, inp, w[weight_role], N, C, OC, gemm_reading(w[weight_role]));
  if (!dout_kept) {
    const size_t n = static_cast<size_t>(N) * OC;
    float* copy = kept_buffer(a, n);
    o.copy(copy, dout, n * sizeof(float));
    dout = copy;
  }
  a.input_only.deferred.push_back({slot, weight_role, bias_role, dout, inp, inp16, N, C, OC});
}

float* Model::kept_buffer(Activations& a, size_t n) const {
  Activations::InputOnlyPass& io = a.input_only;
  if (io.kept_used + round16(n) > io.kept_floats) fail("internal: the kept output gradients overflow");
  float* p = io.kept + io.kept_used;
  io.kept_used += round16(n);
  return p;
}

void Model::weight_backward(Activations& a, const ReadyFn& ready) {
  if (!a.input_only.pending)
    fail("internal: weight_backward without an input-only backward of these activations");
  // Leave the input-only pass (if it is this one), and track readiness afresh: every tensor
  // without a deferred gradient is final now; the deferred ones as their gradients land.
  mode_ = BackwardMode::whole;
  input_only_pass_ = nullptr;
  tracker_.reset(table);
  std::vector<char> deferred_slice(table.slices.size(), 0);
  for (const Activations::DeferredDense& j : a.input_only.deferred)
    for (int r : {j.weight_role, j.bias_role})
      if (r >= 0)
        for (int i : role_slices[j.slot][r]) deferred_slice[i] = 1;
  if (a.input_only.embed_deferred)
    for (int r : {kEmbNormW, kEmbNormB, kTypeEmb, kPosEmb, kTokEmb})
      for (int i : role_slices[0][r]) deferred_slice[i] = 1;
  for (size_t i = 0; i < deferred_slice.size(); i++)
    if (!deferred_slice[i]) tracker_.done(i);
  finished(0, {}, ready);
  // dW[OC,C] += dout^T · inp; db[OC] += Σ_n dout (matmul_backward without dinp)
  for (const Activations::DeferredDense& j : a.input_only.deferred) {
    const BlockTensors& g = j.slot == 0 ? ge : gb[j.slot - 1];
    const BlockTensors& w = j.slot == 0 ? pe : pb[j.slot - 1];
    if (!j.dout) {  // the chunked LM head: its logits gradient recomputed, chunk by chunk
      lm_head_backward_chunks(a, nullptr, g[j.weight_role]);
      // A tied matrix held with the embedding is final only after the embedding's part (below).
      if (!(a.input_only.embed_deferred && j.weight_role == kTokEmb)) finished(j.slot, {j.weight_role}, ready);
      continue;
    }
    GemmMode gm(precision);
    gm.inp_bf16 = j.inp16;
    ops->matmul_backward(nullptr, g[j.weight_role], j.bias_role >= 0 ? g[j.bias_role] : nullptr, j.dout, j.inp,
                         w[j.weight_role], j.N, j.C, j.OC, gm);
    finished(j.slot, {j.weight_role, j.bias_role}, ready);
  }
  // The embedding's gradients last, as in a whole backward (so a tied wte gets the head's and the
  // embedding's additions in the same order).
  if (a.input_only.embed_deferred) {
    a.input_only.embed_deferred = false;
    embed_backward(a, ready);
  }
  if (!tracker_.complete()) fail("internal: weight_backward left gradients unreported");
  a.input_only.deferred.clear();
  a.input_only.kept_used = 0;
  a.input_only.pending = false;
}

void Model::head_backward(Activations& a, const ReadyFn& ready) {
  ensure_scratch(a.B, a.T);
  if (a.head_pass.mode == HeadMode::eval) fail("internal: head_backward after a head_forward without need_grad");
  if (desc.head == HeadKind::lm)
    lm_head_backward(a, ready);
  else
    classifier_backward(a, ready);
}

void Model::backward(Activations& a, const ReadyFn& ready) {
  begin_backward();
  if (part.head) head_backward(a, ready);
  blocks_backward(a, part.l0, part.l1, ready);
  if (part.embedding) embed_backward(a, ready);
  if (!tracker_.complete()) fail("internal: backward left gradients unreported");
}

}  // namespace llmpi
