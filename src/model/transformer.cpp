#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "backend/dropout_hash.h"
#include "runtime/error.h"

namespace llmpi {

// ---- the parameter table ------------------------------------------------------------------------

namespace {

bool is_norm_weight(int role) {
  return role == kEmbNormW || role == kNorm1W || role == kNorm2W || role == kFinalNormW;
}
bool is_bias(int role) {
  return role == kEmbNormB || role == kNorm1B || role == kNorm2B || role == kFinalNormB || role == kQkvB ||
         role == kAttnOutB || role == kFcB || role == kProjB || role == kPoolerB || role == kClsB;
}

struct TableBuilder {
  const ModelDesc& d;
  ParamTable t;
  // How one tensor of a role is cut over the tensor-parallel ranks (ParamSlice's fields).
  struct Cut {
    std::vector<int> whole_shape;
    int split = -1;
    std::vector<std::pair<int, int>> ranges;
  };
  // Adds a role's tensor(s) of `layer`, one shape per Hugging Face name (and, when d.tp > 1 and the
  // role is cut, one Cut each); a family without the role (no name) adds nothing.
  void add(int role, int layer, const std::vector<std::vector<int>>& shapes, const std::vector<Cut>& cuts = {}) {
    const std::vector<std::string> names = family_tensor_names(d.family, role, layer);
    if (names.empty()) return;
    if (names.size() != shapes.size())
      fail("internal: family ", family_name(d.family), " names ", names.size(), " tensors for role ",
           role_name(role), " but the layout has ", shapes.size());
    for (size_t i = 0; i < names.size(); i++) {
      ParamSlice s;
      s.name = names[i];
      s.shape = shapes[i];
      s.layer = layer;
      s.role = role;
      s.decay = shapes[i].size() == 2;
      if (d.tp > 1 && i < cuts.size()) {
        s.whole_shape = cuts[i].whole_shape;
        s.split = cuts[i].split;
        s.ranges = cuts[i].ranges;
      }
      if (is_norm_weight(role)) {
        s.init = InitKind::ones;
      } else if (is_bias(role)) {
        s.init = InitKind::zeros;
      } else {
        s.init = InitKind::normal;
        const bool residual = role == kAttnOutW || role == kProjW;
        s.init_std = d.residual_scaled_init && residual ? d.init_std / std::sqrt(2.0 * d.n_layer) : d.init_std;
      }
      t.add(std::move(s));
    }
  }
  // A dense layer's weight [out, in] (in = 0: its bias [out]) whose output is the parts p of
  // whole_outs[p] rows each, of which this rank holds rows [starts[p], starts[p] + outs[p]) (a
  // column-parallel layer; all of them without tensor parallelism). One tensor per part when the
  // family names the parts apart, else one tensor of all of them.
  void add_rows(int role, int layer, const std::vector<int>& whole_outs, const std::vector<int>& outs,
                const std::vector<int>& starts, int in) {
    const size_t parts = family_tensor_names(d.family, role, layer).size();
    auto shape = [&](int rows) { return in > 0 ? std::vector<int>{rows, in} : std::vector<int>{rows}; };
    std::vector<std::vector<int>> shapes;
    std::vector<Cut> cuts;
    if (parts == outs.size()) {
      for (size_t p = 0; p < outs.size(); p++) {
        shapes.push_back(shape(outs[p]));
        cuts.push_back({shape(whole_outs[p]), 0, {{starts[p], starts[p] + outs[p]}}});
      }
    } else {
      int total = 0, whole_total = 0;
      Cut cut{{}, 0, {}};
      for (size_t p = 0; p < outs.size(); p++) {
        cut.ranges.push_back({whole_total + starts[p], whole_total + starts[p] + outs[p]});
        total += outs[p];
        whole_total += whole_outs[p];
      }
      cut.whole_shape = shape(whole_total);
      shapes.push_back(shape(total));
      cuts.push_back(cut);
    }
    add(role, layer, shapes, cuts);
  }
  // A dense layer's weight [out, whole_in] of which this rank holds the input columns
  // [start, start + in) (a row-parallel layer).
  void add_cols(int role, int layer, int out, int whole_in, int in, int start) {
    add(role, layer, {{out, in}}, {Cut{{out, whole_in}, 1, {{start, start + in}}}});
  }
};

}  // namespace

ParamTable build_param_table(const ModelDesc& d, const ModelPart& part_in) {
  check_model_sizes(d);  // (before anything is built: the widths below are ints, the counts 64-bit)
  ModelPart part = part_in;
  if (part.l1 < 0) part.l1 = d.n_layer;
  if (part.l0 < 0 || part.l0 > part.l1 || part.l1 > d.n_layer)
    fail("model part: blocks [", part.l0, ", ", part.l1, ") are not within [0, ", d.n_layer, ")");
  // Tensor parallelism (d.tp > 1, "Tensor parallelism" in transformer.h): this rank's shard —
  // QKV and the MLP's first projection by output rows, the output projections by input columns,
  // the token embedding and the LM head by vocabulary rows; the rest whole.
  const int C = d.d_model, V = d.vocab_size, hs = d.head_dim(), r = d.tp_rank;
  const int F = d.ffn_dim, Fl = d.ffn(), V0 = d.vocab_begin(), Vl = d.vocab_rows();
  const int qd = d.n_head * hs, kvd = d.n_kv_head * hs, qdl = d.heads() * hs, kvdl = d.kv_heads() * hs;
  const bool layer_norm = d.norm == NormKind::layernorm;
  TableBuilder b{d, {}};
  // Backward order: the head, the blocks from last to first, the embedding.
  if (part.head) {
    if (d.head == HeadKind::lm) {
      if (!d.tie_embeddings) b.add_rows(kLmHead, -1, {V}, {Vl}, {V0}, C);
      if (d.final_norm) {
        b.add(kFinalNormW, -1, {{C}});
        if (layer_norm) b.add(kFinalNormB, -1, {{C}});
      }
    } else {
      b.add(kClsW, -1, {{d.num_labels, C}});
      b.add(kClsB, -1, {{d.num_labels}});
      b.add(kPoolerW, -1, {{C, C}});
      b.add(kPoolerB, -1, {{C}});
    }
  }
  for (int l = part.l1 - 1; l >= part.l0; l--) {
    auto norm = [&](int w, int bias) {
      b.add(w, l, {{C}});
      if (layer_norm) b.add(bias, l, {{C}});
    };
    auto mlp = [&] {
      b.add_cols(kProjW, l, C, F, Fl, r * Fl);
      if (d.bias) b.add(kProjB, l, {{C}});
      const bool two = d.mlp == MlpKind::swiglu;
      const std::vector<int> whole = two ? std::vector<int>{F, F} : std::vector<int>{F};
      const std::vector<int> mine = two ? std::vector<int>{Fl, Fl} : std::vector<int>{Fl};
      const std::vector<int> starts = two ? std::vector<int>{r * Fl, r * Fl} : std::vector<int>{r * Fl};
      b.add_rows(kFcW, l, whole, mine, starts, C);
      if (d.bias) b.add_rows(kFcB, l, whole, mine, starts, 0);
    };
    auto attn = [&] {
      b.add_cols(kAttnOutW, l, C, qd, qdl, r * qdl);
      if (d.bias) b.add(kAttnOutB, l, {{C}});
      b.add_rows(kQkvW, l, {qd, kvd, kvd}, {qdl, kvdl, kvdl}, {r * qdl, r * kvdl, r * kvdl}, C);
      if (d.bias) b.add_rows(kQkvB, l, {qd, kvd, kvd}, {qdl, kvdl, kvdl}, {r * qdl, r * kvdl, r * kvdl}, 0);
    };
    if (d.pre_norm) {  // backward: MLP branch, norm2, attention branch, norm1
      mlp();
      norm(kNorm2W, kNorm2B);
      attn();
      norm(kNorm1W, kNorm1B);
    } else {           // backward: norm2, MLP branch, norm1, attention branch
      norm(kNorm2W, kNorm2B);
      mlp();
      norm(kNorm1W, kNorm1B);
      attn();
    }
  }
  if (part.embedding) {
    if (d.embedding_norm) {
      b.add(kEmbNormW, -1, {{C}});
      b.add(kEmbNormB, -1, {{C}});
    }
    if (d.type_vocab_size > 0) b.add(kTypeEmb, -1, {{d.type_vocab_size, C}});
    if (d.learned_positions) b.add(kPosEmb, -1, {{d.max_seq_len, C}});
    b.add_rows(kTokEmb, -1, {V}, {Vl}, {V0}, C);
  } else if (part.head && d.head == HeadKind::lm && d.tie_embeddings) {
    b.add_rows(kTokEmb, -1, {V}, {Vl}, {V0}, C);  // this part's copy of the tied matrix, for the head
  }
  return b.t;
}

// ---- the model ------------------------------------------------------------------------------------

Model::Model(const ModelDesc& d, const Ops& o, const ModelPart& p, GemmPrecision prec, Recompute rc)
    : desc(d), part(p), ops(&o), precision(prec), recompute(rc) {
  if (part.l1 < 0) part.l1 = d.n_layer;
  if (prec == GemmPrecision::tf32 && !o.on_gpu())
    fail("runtime.precision \"tf32\" is a CUDA tensor-core mode; use \"fp32\" or \"bf16\" on the CPU");
  if (d.n_layer < 1 || d.n_head < 1 || d.d_model % d.n_head != 0 || d.n_kv_head < 1 || d.n_head % d.n_kv_head != 0)
    fail("model: inconsistent shape (n_layer ", d.n_layer, ", n_head ", d.n_head, ", n_kv_head ", d.n_kv_head,
         ", d_model ", d.d_model, ")");
  if (d.head == HeadKind::classifier && d.num_labels < 1) fail("model: a classifier needs model.num_labels >= 1");
  table = build_param_table(d, part);
  params = static_cast<float*>(ops->alloc(table.numel * sizeof(float)));
  grads = static_cast<float*>(ops->alloc(table.numel * sizeof(float)));
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
  ops->free(params);
  ops->free(grads);
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
  std::vector<float> host(table.numel);
  init_param_values(table, seed, host.data());
  ops->copy_to_device(params, host.data(), host.size() * sizeof(float));
}

void Model::zero_grads() { ops->zero(grads, table.numel * sizeof(float)); }

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

// ---- activations ----------------------------------------------------------------------------------

Activations::~Activations() {
  if (model) {
    model->ops->free(mem_);
    model->ops->free(ids_);
    model->ops->free(kept);
  }
}

void Activations::reserve_kept(size_t floats) {
  if (!model) fail("internal: reserve_kept before allocate");
  if (floats <= kept_floats) return;
  model->ops->free(kept);
  bytes_ -= kept_floats * sizeof(float);
  kept = static_cast<float*>(model->ops->alloc(floats * sizeof(float)));
  kept_floats = floats;
  bytes_ += floats * sizeof(float);
}

void Activations::allocate(const Model& m, int B_, int T_) {
  const ModelDesc& d = m.desc;
  if (T_ > d.max_seq_len)
    fail("sequence length ", T_, " exceeds the model's max_seq_len ", d.max_seq_len);
  const int lm_rows_ = m.part.head && d.head == HeadKind::lm
                          ? (all_logits ? B_ * T_ : lm_head_chunk_rows(d, B_ * T_)) : 0;
  if (model == &m && B == B_ && T == T_ && attention == d.attention && lm_rows == lm_rows_ &&
      bf16_planned_ == bf16_operands && recompute_planned_ == m.recompute)
    return;
  if (model) {
    model->ops->free(mem_);
    model->ops->free(ids_);
    model->ops->free(kept);
  }
  kept = nullptr;
  kept_floats = kept_used = 0;
  deferred.clear();
  weight_grads_pending = false;
  model = &m;
  B = B_;
  T = T_;
  attention = d.attention;
  lm_rows = lm_rows_;
  head_grad = false;
  bf16_planned_ = bf16_operands;
  recompute_planned_ = m.recompute;
  shared_layer = -1;
  // bf16 operands ("bf16 weight copy" in transformer.h): the pre-norm norms' outputs and the MLP's
  // activation output (read only by GEMMs) kept only in bf16, the LM head's logits gradient in
  // bf16. Their buffers are planned in floats (2 values each) through `half`, whose pointers
  // become the uint16 ones after the allocation.
  const bool bf16 = m.precision == GemmPrecision::bf16 && bf16_operands;
  // (with sequence parallelism the norms' outputs are gathered as fp32: kept in fp32)
  const bool norms16 = bf16 && d.pre_norm && !d.seq_shards();
  std::vector<std::pair<uint16_t**, float*>> half;
  half.reserve(3 * (m.part.l1 - m.part.l0) + 2);
  final_norm = nullptr;
  final_norm_bf16 = logits_grad_bf16 = nullptr;
  // Full attention keeps P [B, NH, T, T] per layer, fused attention one lse per query row.
  const bool fused = attention == AttentionImpl::fused;
  const size_t N = static_cast<size_t>(B) * T, C = d.d_model;
  // The residual stream's rows: all N, or with sequence parallelism this rank's Nr = N / tp.
  const size_t Nr = static_cast<size_t>(d.residual_rows(static_cast<int>(N)));
  const size_t att = fused ? 0 : static_cast<size_t>(B) * d.heads() * T * T;
  const size_t lse = fused ? static_cast<size_t>(B) * d.heads() * T : 0;
  const size_t QKV = d.qkv_dim(), FC = d.fc_dim(), F = d.ffn(), AY = static_cast<size_t>(d.heads()) * d.head_dim();
  std::vector<std::pair<float**, size_t>> plan = {{&input, Nr * C}, {&dresidual, Nr * C}, {&tmp, N * C}};
  gathered = scattered = nullptr;
  if (d.seq_shards()) plan.insert(plan.end(), {{&gathered, N * C}, {&scattered, Nr * C}});
  if (m.part.embedding && d.embedding_norm)
    plan.insert(plan.end(), {{&emb_sum, Nr * C}, {&emb_mean, Nr}, {&emb_rstd, Nr}});
  // n values of 2 bytes, planned in floats
  auto plan_half = [&](uint16_t** p, size_t n) {
    half.push_back({p, nullptr});
    plan.push_back({&half.back().second, (n + 1) / 2});
  };
  // a norm's output: fp32, or only bf16
  auto plan_norm = [&](float** p, uint16_t** p16) {
    if (norms16) plan_half(p16, Nr * C);
    else plan.push_back({p, Nr * C});
  };
  // Recomputation ("Activation recomputation" in transformer.h): a shared tensor is planned for
  // the first block only, and the other blocks point at it.
  using F32 = float* Layer::*;
  using F16 = uint16_t* Layer::*;
  std::vector<F32> shared32;
  std::vector<F16> shared16;
  if (m.recompute == Recompute::selective) {
    shared32 = {&Layer::act, &Layer::att};
    shared16 = {&Layer::act_bf16};
    if (d.pre_norm) {
      shared32.insert(shared32.end(), {&Layer::norm1, &Layer::norm2});
      shared16.insert(shared16.end(), {&Layer::norm1_bf16, &Layer::norm2_bf16});
    }
  } else if (m.recompute == Recompute::full) {  // all but the block's output
    shared32 = {&Layer::norm1, &Layer::norm1_mean, &Layer::norm1_rstd, &Layer::qkv, &Layer::atty, &Layer::att,
                &Layer::lse, &Layer::res_attn, &Layer::norm2, &Layer::norm2_mean, &Layer::norm2_rstd, &Layer::fc,
                &Layer::act};
    if (!d.pre_norm) shared32.push_back(&Layer::res_mlp);  // (pre-norm: res_mlp is the output)
    shared16 = {&Layer::norm1_bf16, &Layer::norm2_bf16, &Layer::act_bf16};
  }
  auto is_shared32 = [&](F32 f) { return std::find(shared32.begin(), shared32.end(), f) != shared32.end(); };
  auto is_shared16 = [&](F16 f) { return std::find(shared16.begin(), shared16.end(), f) != shared16.end(); };
  layers.assign(m.part.l1 - m.part.l0, {});
  for (size_t i = 0; i < layers.size(); i++) {
    Layer& L = layers[i];
    auto f32 = [&](F32 f, size_t n) {
      if (i == 0 || !is_shared32(f)) plan.push_back({&(L.*f), n});
    };
    auto f16 = [&](F16 f, size_t n) {
      if (i == 0 || !is_shared16(f)) plan_half(&(L.*f), n);
    };
    auto norm = [&](F32 f, F16 f_bf16) {  // a norm's output: fp32, or only bf16
      if (norms16) f16(f_bf16, Nr * C);
      else f32(f, Nr * C);
    };
    norm(&Layer::norm1, &Layer::norm1_bf16);
    f32(&Layer::norm1_mean, Nr);
    f32(&Layer::norm1_rstd, Nr);
    f32(&Layer::qkv, N * QKV);
    f32(&Layer::atty, N * AY);
    if (fused) f32(&Layer::lse, lse);
    else f32(&Layer::att, att);
    f32(&Layer::res_attn, Nr * C);
    norm(&Layer::norm2, &Layer::norm2_bf16);
    f32(&Layer::norm2_mean, Nr);
    f32(&Layer::norm2_rstd, Nr);
    f32(&Layer::fc, N * FC);
    if (bf16) f16(&Layer::act_bf16, N * F);
    else f32(&Layer::act, N * F);
    f32(&Layer::res_mlp, Nr * C);
    if (!d.pre_norm) f32(&Layer::out, Nr * C);
  }
  // A bf16 LM head's logits gradient in bf16; the chunk buffers' rows padded (logits_ld).
  const bool bf16_grad = bf16 && m.part.head && d.head == HeadKind::lm && !all_logits && d.tp == 1;
  logits_ld = !m.part.head ? 0
              : d.head == HeadKind::lm ? (all_logits ? d.vocab_rows() : lm_logits_row_stride(d.vocab_rows()))
                                       : d.num_labels;
  if (m.part.head) {
    if (d.head == HeadKind::lm) {
      plan_norm(&final_norm, &final_norm_bf16);
      plan.insert(plan.end(), {{&final_mean, Nr}, {&final_rstd, Nr},
                               {&logits, static_cast<size_t>(lm_rows) * logits_ld}, {&losses, N}});
      if (bf16_grad) plan_half(&logits_grad_bf16, static_cast<size_t>(lm_rows) * logits_ld);
      if (d.tp > 1) plan.push_back({&xent_stats, 3 * static_cast<size_t>(lm_rows)});
    } else {
      const size_t BC = static_cast<size_t>(B) * C;
      plan.insert(plan.end(), {{&cls, BC}, {&pooled_pre, BC}, {&pooled, BC}, {&pooled_drop, BC},
                               {&logits, static_cast<size_t>(B) * d.num_labels}, {&losses, static_cast<size_t>(B)}});
    }
  }
  size_t total = 0;
  for (auto& e : plan) total += activation_floats_aligned(e.second);  // every tensor 256-byte aligned
  mem_ = static_cast<float*>(m.ops->alloc(total * sizeof(float)));
  size_t off = 0;
  for (auto& e : plan) {
    *e.first = mem_ + off;
    off += activation_floats_aligned(e.second);
  }
  for (auto& h : half) *h.first = reinterpret_cast<uint16_t*>(h.second);
  for (size_t i = 1; i < layers.size(); i++) {
    for (F32 f : shared32) layers[i].*f = layers[0].*f;
    for (F16 f : shared16) layers[i].*f = layers[0].*f;
  }
  for (Layer& L : layers)
    if (d.pre_norm) L.out = L.res_mlp;
  // The ids, then the step's scalars (zero: no bad target yet; 4·N int32 keep them 8-byte aligned).
  ids_ = static_cast<int32_t*>(m.ops->alloc(4 * N * sizeof(int32_t) + sizeof(StepScalars)));
  tokens = ids_;
  targets = ids_ + N;
  token_types = ids_ + 2 * N;
  attn_mask = ids_ + 3 * N;
  scalars = reinterpret_cast<StepScalars*>(ids_ + 4 * N);
  losses_host.resize(m.rows_for_loss(B, T));
  bytes_ = total * sizeof(float) + 4 * N * sizeof(int32_t) + sizeof(StepScalars);
}

// ---- forward ----------------------------------------------------------------------------------------

namespace {

// out16: the output in bf16 (with out null: only there), a bf16 GEMM's input.
void norm_forward(const Ops& o, const ModelDesc& d, float* out, uint16_t* out16, float* mean, float* rstd,
                  const float* x, const float* w, const float* b, int N) {
  if (d.norm == NormKind::layernorm)
    o.layernorm_forward(out, mean, rstd, x, w, b, N, d.d_model, static_cast<float>(d.norm_eps), out16);
  else
    o.rmsnorm_forward(out, rstd, x, w, N, d.d_model, static_cast<float>(d.norm_eps), out16);
}

// res = a + b, then out = norm(res): one fused op (one pass over each row on the GPU).
void residual_norm_forward(const Ops& o, const ModelDesc& d, float* res, float* out, uint16_t* out16, float* mean,
                           float* rstd, const float* a, const float* b, const float* w, const float* bias, int N) {
  if (d.norm == NormKind::layernorm)
    o.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, d.d_model, static_cast<float>(d.norm_eps), out16);
  else
    o.residual_rmsnorm_forward(res, out, rstd, a, b, w, N, d.d_model, static_cast<float>(d.norm_eps), out16);
}

void norm_backward(const Ops& o, const ModelDesc& d, float* dx, float* dw, float* db, const float* dout,
                   const float* x, const float* w, const float* mean, const float* rstd, int N) {
  if (d.norm == NormKind::layernorm)
    o.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, d.d_model);
  else
    o.rmsnorm_backward(dx, dw, dout, x, w, rstd, N, d.d_model);
}

// The activations hold the attention state of the model's attention implementation (a desc
// changed after they were allocated would leave att/lse null or too small).
void check_attention_state(const Activations& a, const ModelDesc& d) {
  if (a.attention != d.attention)
    fail("internal: activations allocated for ", attention_impl_name(a.attention), " attention, but the model runs ",
         attention_impl_name(d.attention), " attention (allocate them again)");
}

uint64_t drop_key(const Activations& a, int layer, int site) {
  const DropoutContext& c = a.dropout;
  return dropout_key(c.seed, c.step, c.rank, c.micro_batch, layer, site);
}

// Hidden dropout on the residual stream's rows: with sequence parallelism each rank holds its own
// rows, so each draws from its own stream (the masks of one rank's distribution, not the same
// masks); otherwise drop_key, the same on every rank of a tensor-parallel group.
uint64_t hidden_drop_key(const Activations& a, int layer, int site) {
  const uint64_t k = drop_key(a, layer, site);
  const ModelDesc& d = a.model->desc;
  return d.seq_shards() ? mix64(k ^ (0xbf58476d1ce4e5b9ull * static_cast<uint64_t>(d.tp_rank + 1))) : k;
}

// Attention-probability dropout: its mask is indexed by this rank's heads, so each shard of a
// tensor-parallel group draws from its own stream (masks of the same distribution as one rank's,
// not the same masks); every other mask is the same on every rank of the group.
uint64_t attn_drop_key(const Activations& a, int layer) {
  const uint64_t k = drop_key(a, layer, kDropAttnProbs);
  const ModelDesc& d = a.model->desc;
  return d.tp > 1 ? mix64(k ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(d.tp_rank + 1))) : k;
}

}  // namespace

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

void Model::embed_forward(Activations& a) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T, Nr = d.residual_rows(N);
  float* sum = d.embedding_norm ? a.emb_sum : a.input;  // (the residual stream's rows)
  const float* wpe = d.learned_positions ? pe[kPosEmb] : nullptr;
  if (d.tp == 1) {
    o.embedding_forward(sum, a.tokens, pe[kTokEmb], wpe, B, T, C);
  } else if (!d.seq_shards()) {  // each token's row from the rank that holds it (0 elsewhere), the positions from rank 0
    o.vocab_embedding_forward(sum, a.tokens, pe[kTokEmb], d.vocab_begin(), d.vocab_rows(),
                              d.tp_rank == 0 ? wpe : nullptr, B, T, C);
    tensor.sum(sum, static_cast<size_t>(N) * C);
  } else {  // the same into a.tmp, the token types from rank 0 too, reduce-scattered to this rank's rows
    o.vocab_embedding_forward(a.tmp, a.tokens, pe[kTokEmb], d.vocab_begin(), d.vocab_rows(),
                              d.tp_rank == 0 ? wpe : nullptr, B, T, C);
    if (d.type_vocab_size > 0 && d.tp_rank == 0) o.embedding_add_forward(a.tmp, a.token_types, pe[kTypeEmb], N, C);
    tensor.reduce_scatter(a.tmp, sum, static_cast<size_t>(Nr) * C);
  }
  if (d.type_vocab_size > 0 && !d.seq_shards()) o.embedding_add_forward(sum, a.token_types, pe[kTypeEmb], N, C);
  if (d.embedding_norm)
    o.layernorm_forward(a.input, a.emb_mean, a.emb_rstd, sum, pe[kEmbNormW], pe[kEmbNormB], Nr, C,
                        static_cast<float>(d.norm_eps), nullptr);
  if (a.dropout.training && d.dropout > 0)
    o.dropout_forward(a.input, a.input, static_cast<size_t>(Nr) * C, d.dropout,
                      hidden_drop_key(a, -1, kDropEmbedding));
}

void Model::check_block_range(int from, int to) const {
  if (from < part.l0 || to > part.l1 || from > to)
    fail("internal: blocks [", from, ", ", to, ") are not within the part's [", part.l0, ", ", part.l1, ")");
}

void Model::blocks_forward(Activations& a, int from, int to) const {
  check_block_range(from, to);
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T, NH = d.heads(), NKV = d.kv_heads(), hs = d.head_dim();
  const int QKV = d.qkv_dim(), F = d.ffn(), FC = d.fc_dim(), AY = NH * hs;
  // The residual stream's rows (sequence parallelism: this rank's Nr of the N) and their floats.
  const int Nr = d.residual_rows(N);
  const size_t NC = static_cast<size_t>(Nr) * C;
  const bool sp = d.seq_shards();
  const float p = a.dropout.training ? d.dropout : 0.0f, pa = a.dropout.training ? d.attn_dropout : 0.0f;
  const int32_t* mask = a.has_mask ? a.attn_mask : nullptr;
  check_attention_state(a, d);
  // A branch's GEMM input from the residual stream's rows: as it is, or all-gathered.
  auto gather = [&](const float* rows) -> const float* {
    if (!sp) return rows;
    tensor.all_gather(rows, a.gathered, NC);
    return a.gathered;
  };
  // A branch's output (a.tmp, [N, C], each rank's partial sum with tensor parallelism) onto the
  // residual stream's rows, dropout applied: a.tmp itself, or reduce-scattered into a.scattered.
  auto branch_out = [&](int l, int site) -> float* {
    float* out = a.tmp;
    if (sp) tensor.reduce_scatter(a.tmp, a.scattered, NC), out = a.scattered;
    else tp_sum(a.tmp, NC);
    if (p > 0) o.dropout_forward(out, out, NC, p, hidden_drop_key(a, l, site));
    return out;
  };
  for (int l = from; l < to; l++) {
    const int i = l - part.l0;
    const BlockTensors& w = pb[i];
    Activations::Layer& L = a.layers[i];
    const float* x = i == 0 ? a.input : a.layers[i - 1].out;
    // Attention: branch input h = N1(x) (pre-norm) or x (post-norm).
    // (a bf16 pre-norm model keeps the norms' outputs only in bf16: h16, the GEMM's input)
    const float* h = x;
    const uint16_t* h16 = nullptr;
    if (d.pre_norm) {
      norm_forward(o, d, L.norm1, L.norm1_bf16, L.norm1_mean, L.norm1_rstd, x, w[kNorm1W], w[kNorm1B], Nr);
      h = L.norm1;
      h16 = L.norm1_bf16;
    }
    h = gather(h);
    GemmMode qkv_gemm = gemm_rounding(w[kQkvW], static_cast<size_t>(QKV) * C);
    qkv_gemm.inp_bf16 = h16;
    o.matmul_forward(L.qkv, h, w[kQkvW], w[kQkvB], N, C, QKV, qkv_gemm);
    if (!d.learned_positions) {
      o.rope_forward(L.qkv, B, T, NH, hs, QKV, static_cast<float>(d.rope_theta));
      o.rope_forward(L.qkv + AY, B, T, NKV, hs, QKV, static_cast<float>(d.rope_theta));
    }
    if (d.attention == AttentionImpl::fused)
      o.flash_attention_forward(L.atty, L.lse, L.qkv, mask, B, T, NH, NKV, hs, d.causal, pa,
                                attn_drop_key(a, l), precision);
    else
      o.attention_forward(L.atty, L.att, L.qkv, mask, B, T, NH, NKV, hs, d.causal, pa, attn_drop_key(a, l));
    // (row-parallel: each rank's partial sum, the bias added once, then summed over the group)
    o.matmul_forward(a.tmp, L.atty, w[kAttnOutW], d.tp_rank == 0 ? w[kAttnOutB] : nullptr, N, AY, C,
                     gemm_rounding(w[kAttnOutW], static_cast<size_t>(C) * AY));
    const float* attn_out = branch_out(l, kDropAttnOut);
    // res_attn = x + branch, and the MLP's branch input N2(res_attn) (pre-norm) or
    // norm1 = LN1(res_attn) (post-norm), in one fused op.
    const float* h2;
    const uint16_t* h2_16 = nullptr;
    if (d.pre_norm) {
      residual_norm_forward(o, d, L.res_attn, L.norm2, L.norm2_bf16, L.norm2_mean, L.norm2_rstd, x, attn_out,
                            w[kNorm2W], w[kNorm2B], Nr);
      h2 = L.norm2;
      h2_16 = L.norm2_bf16;
    } else {
      residual_norm_forward(o, d, L.res_attn, L.norm1, nullptr, L.norm1_mean, L.norm1_rstd, x, attn_out, w[kNorm1W],
                            w[kNorm1B], Nr);
      h2 = L.norm1;
    }
    h2 = gather(h2);
    GemmMode fc_gemm = gemm_rounding(w[kFcW], static_cast<size_t>(FC) * C);
    fc_gemm.inp_bf16 = h2_16;
    switch (d.mlp) {  // GELU (tanh) is fused with its dense layer (a cuBLASLt epilogue on CUDA)
      case MlpKind::gelu_tanh:
        o.matmul_gelu_forward(L.fc, L.act, h2, w[kFcW], w[kFcB], N, C, FC, fc_gemm, L.act_bf16);
        break;
      case MlpKind::gelu_erf:
        o.matmul_forward(L.fc, h2, w[kFcW], w[kFcB], N, C, FC, fc_gemm);
        o.gelu_erf_forward(L.act, L.fc, static_cast<size_t>(N) * F, L.act_bf16);
        break;
      case MlpKind::swiglu:
        o.matmul_forward(L.fc, h2, w[kFcW], w[kFcB], N, C, FC, fc_gemm);
        o.swiglu_forward(L.act, L.fc, N, F, L.act_bf16);
        break;
    }
    GemmMode proj_gemm = gemm_rounding(w[kProjW], static_cast<size_t>(C) * F);
    proj_gemm.inp_bf16 = L.act_bf16;
    o.matmul_forward(a.tmp, L.act, w[kProjW], d.tp_rank == 0 ? w[kProjB] : nullptr, N, F, C, proj_gemm);
    const float* mlp_out = branch_out(l, kDropMlpOut);
    if (d.pre_norm)
      o.residual_forward(L.res_mlp, L.res_attn, mlp_out, NC);
    else  // res_mlp = norm1 + branch; out = LN2(res_mlp)
      residual_norm_forward(o, d, L.res_mlp, L.out, nullptr, L.norm2_mean, L.norm2_rstd, L.norm1, mlp_out, w[kNorm2W],
                            w[kNorm2B], Nr);
    a.shared_layer = l;
  }
}

void Model::recompute_block(Activations& a, int l) const {
  if (recompute == Recompute::none || a.shared_layer == l) return;
  if (recompute == Recompute::full) return blocks_forward(a, l, l + 1);  // (sets shared_layer)
  // selective: the forward's ops on the forward's (kept) operands, so the same bits
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, N = B * T, F = d.ffn();
  const int i = l - part.l0;
  const BlockTensors& w = pb[i];
  Activations::Layer& L = a.layers[i];
  const float* x = i == 0 ? a.input : a.layers[i - 1].out;
  if (d.pre_norm) {
    // norm2 was written by the fused residual + norm op, whose bits are those of the norm of res_attn
    const int Nr = d.residual_rows(N);
    norm_forward(o, d, L.norm1, L.norm1_bf16, L.norm1_mean, L.norm1_rstd, x, w[kNorm1W], w[kNorm1B], Nr);
    norm_forward(o, d, L.norm2, L.norm2_bf16, L.norm2_mean, L.norm2_rstd, L.res_attn, w[kNorm2W], w[kNorm2B], Nr);
  }
  if (d.attention == AttentionImpl::full) {  // P again; its output (the kept atty's bits) into the free tmp
    const float pa = a.dropout.training ? d.attn_dropout : 0.0f;
    o.attention_forward(a.tmp, L.att, L.qkv, a.has_mask ? a.attn_mask : nullptr, B, T, d.heads(), d.kv_heads(),
                        d.head_dim(), d.causal, pa, attn_drop_key(a, l));
  }
  const size_t n = static_cast<size_t>(N) * F;
  switch (d.mlp) {
    case MlpKind::gelu_tanh:
      if (L.act) {
        o.gelu_forward(L.act, L.fc, n);
      } else {  // kept only in bf16: through tmp, a piece at a time (each value rounded as the forward did)
        const size_t piece = static_cast<size_t>(N) * d.d_model;
        for (size_t k = 0; k < n; k += piece) {
          const size_t m = std::min(piece, n - k);
          o.gelu_forward(a.tmp, L.fc + k, m);
          o.bf16_copy(L.act_bf16 + k, a.tmp, m);
        }
      }
      break;
    case MlpKind::gelu_erf:
      o.gelu_erf_forward(L.act, L.fc, n, L.act_bf16);
      break;
    case MlpKind::swiglu:
      o.swiglu_forward(L.act, L.fc, N, F, L.act_bf16);
      break;
  }
  a.shared_layer = l;
}

void Model::head_forward_queued(Activations& a, bool need_grad, float grad_scale) const {
  head_forward_impl(a, need_grad, grad_scale, false);
}

void Model::train_head_forward_queued(Activations& a, float grad_scale, bool fused) const {
  head_forward_impl(a, true, grad_scale, fused && desc.head == HeadKind::lm);
}

void Model::head_forward_impl(Activations& a, bool need_grad, float grad_scale, bool fused) const {
  // (the cross-entropy writes a gradient only for a scale != 0; a backward would read stale logits)
  if (need_grad && grad_scale == 0.0f) fail("internal: a head forward with need_grad and grad_scale 0");
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T;
  const float* x = a.output();
  int rows = 0;
  // Targets outside [0, V) are recorded in a.scalars->bad_target (cleared here, once per forward)
  // and reported by read_scalars: no host wait per chunk.
  uint64_t* bad = &a.scalars->bad_target;
  o.zero(bad, sizeof(uint64_t));
  const int Nr = d.residual_rows(N);
  if (d.head == HeadKind::lm) {
    const float* xf = x;
    const uint16_t* xf16 = nullptr;  // a bf16 model's final norm output, kept only in bf16
    if (d.final_norm) {
      norm_forward(o, d, a.final_norm, a.final_norm_bf16, a.final_mean, a.final_rstd, x, pe[kFinalNormW],
                   pe[kFinalNormB], Nr);
      xf = a.final_norm;
      xf16 = a.final_norm_bf16;
    }
    if (d.seq_shards()) {  // every row's xf: gathered (lm_xf reads it there until head_backward)
      tensor.all_gather(xf, a.gathered, static_cast<size_t>(Nr) * C);
      xf = a.gathered;
    }
    const float* W = d.tie_embeddings ? pe[kTokEmb] : pe[kLmHead];
    const int V = d.vocab_rows();  // this rank's vocabulary rows (all of them without tensor parallelism)
    const GemmMode head_gemm = gemm_rounding(W, static_cast<size_t>(V) * C);  // once for every chunk
    rows = N;
    const int R = a.lm_rows;
    if (fused) {
      // Fused ("Fused LM head" in transformer.h): the recomputing backward itself, run now with
      // nothing to reuse — every chunk's logits, loss (and target check) and gradient, then its
      // dxf and dW — into a.tmp (d xf, zeroed here; the forward's scratch is free after the
      // blocks) and the head weight's gradient: the same bits as a backward would add.
      a.head_grad_scale = grad_scale;
      a.lm_last_grad = false;
      o.zero(a.tmp, static_cast<size_t>(N) * C * sizeof(float));
      lm_head_backward_chunks(a, a.tmp, ge[d.tie_embeddings ? kTokEmb : kLmHead]);
    } else {
      // Chunked ("Chunked LM head" in transformer.h): per chunk of R rows, logits = xf·W^T, then
      // the loss per row (with need_grad the gradient too, as the unchunked head computed it, so
      // the losses are the same bits; head_backward recomputes it).
      for (int r0 = 0; r0 < N; r0 += R) {
        const int rn = std::min(R, N - r0);
        GemmMode chunk_gemm = head_gemm;
        chunk_gemm.inp_bf16 = xf16 ? xf16 + static_cast<size_t>(r0) * C : nullptr;
        chunk_gemm.out_ld = a.logits_ld;
        o.matmul_forward(a.logits, xf ? xf + static_cast<size_t>(r0) * C : nullptr, W, nullptr, rn, C, V, chunk_gemm);
        lm_xent(a, r0, rn, need_grad ? grad_scale / static_cast<float>(N) : 0.0f);
      }
    }
  } else {
    rows = B;
    const size_t BC = static_cast<size_t>(B) * C;
    if (d.seq_shards()) {  // every sequence's first row: from the gathered rows
      tensor.all_gather(x, a.gathered, static_cast<size_t>(Nr) * C);
      x = a.gathered;
    }
    o.first_token_forward(a.cls, x, B, T, C);
    o.matmul_forward(a.pooled_pre, a.cls, pe[kPoolerW], pe[kPoolerB], B, C, C,
                     gemm_rounding(pe[kPoolerW], static_cast<size_t>(C) * C));
    o.tanh_forward(a.pooled, a.pooled_pre, BC);
    const float* pd = a.pooled;
    if (a.dropout.training && d.dropout > 0) {
      o.dropout_forward(a.pooled_drop, a.pooled, BC, d.dropout, drop_key(a, d.n_layer, kDropPooler));
      pd = a.pooled_drop;
    }
    o.matmul_forward(a.logits, pd, pe[kClsW], pe[kClsB], B, C, d.num_labels,
                     gemm_rounding(pe[kClsW], static_cast<size_t>(d.num_labels) * C));
    o.softmax_xent_record(a.logits, d.num_labels, a.losses, a.targets, B, d.num_labels,
                          need_grad ? grad_scale / static_cast<float>(B) : 0.0f, bad, 0);
  }
  a.head_grad = need_grad;
  a.head_grad_scale = grad_scale;
  a.lm_head_fused = fused && d.head == HeadKind::lm;
  // The chunk buffer holds the last chunk's gradient (after a fused head, lm_head_backward_chunks
  // said whether it does: chunk 0's is the last it wrote).
  if (!a.lm_head_fused) a.lm_last_grad = need_grad && d.head == HeadKind::lm;
  // Σ of the per-row losses in double (on the CPU in row order: the host loop's bits).
  o.sum_to_double(&a.scalars->loss_sum, a.losses, static_cast<size_t>(rows));
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

float Model::train_head_forward(Activations& a, float grad_scale) const {
  return head_forward_read(a, true, grad_scale, desc.head == HeadKind::lm);
}

float Model::head_forward(Activations& a, bool need_grad, float grad_scale) const {
  return head_forward_read(a, need_grad, grad_scale, false);
}

float Model::head_forward_read(Activations& a, bool need_grad, float grad_scale, bool fused) const {
  head_forward_impl(a, need_grad, grad_scale, fused);
  read_scalars(a);  // the target check
  const int rows = rows_for_loss(a.B, a.T);
  ops->copy_to_host(a.losses_host.data(), a.losses, static_cast<size_t>(rows) * sizeof(float));
  double sum = 0;
  for (int r = 0; r < rows; r++) sum += a.losses_host[r];
  return static_cast<float>(sum / rows);
}

void Model::forward_queued(Activations& a, const Batch& b, bool need_grad, float grad_scale) const {
  load_batch(a, b);
  if (part.embedding) embed_forward(a);
  blocks_forward(a, part.l0, part.l1);
  if (part.head) head_forward_queued(a, need_grad, grad_scale);
}

void Model::train_forward_queued(Activations& a, const Batch& b, float grad_scale) const {
  load_batch(a, b);
  if (part.embedding) embed_forward(a);
  blocks_forward(a, part.l0, part.l1);
  if (part.head) head_forward_impl(a, true, grad_scale, desc.head == HeadKind::lm);
}

float Model::train_forward(Activations& a, const Batch& b, float grad_scale) const {
  train_forward_queued(a, b, grad_scale);
  return part.head ? loss_of(read_scalars(a), a) : 0.0f;
}

float Model::forward(Activations& a, const Batch& b, bool need_grad, float grad_scale) const {
  load_batch(a, b);
  if (part.embedding) embed_forward(a);
  blocks_forward(a, part.l0, part.l1);
  return part.head ? head_forward(a, need_grad, grad_scale) : 0.0f;
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

void Model::ensure_scratch(int B, int T) {
  const ModelDesc& d = desc;
  const size_t N = static_cast<size_t>(B) * T, C = d.d_model;
  // d_att_: full attention's T x T backward scratch (fused attention needs none); d_act_: none for
  // GELU (tanh), whose backward goes from the projection's output gradient to d_fc in one op
  const size_t att = d.attention == AttentionImpl::fused ? 0 : static_cast<size_t>(B) * d.heads() * T * T;
  const size_t act = d.mlp == MlpKind::gelu_tanh ? 0 : N * d.ffn();
  // sequence parallelism: a gathered [N, C] gradient and a norm's weight gradients [2, C]
  const bool sp = d.seq_shards();
  const size_t sizes[] = {N * C, N * C, N * d.qkv_dim(), N * d.fc_dim(), act, att,
                          3 * static_cast<size_t>(B) * C, sp ? N * C : 0, sp ? 2 * C : 0};
  size_t total = 0;
  for (size_t s : sizes) total += (s + 15) / 16 * 16;
  if (total > scratch_floats_) {
    ops->free(scratch_);
    scratch_ = static_cast<float*>(ops->alloc(total * sizeof(float)));
    scratch_floats_ = total;
  }
  float** ptrs[] = {&d_a_, &d_b_, &d_qkv_, &d_fc_, &d_act_, &d_att_, &d_small_, &d_full_, &d_norm_};
  size_t off = 0;
  for (size_t i = 0; i < 9; i++) {
    *ptrs[i] = scratch_ + off;
    off += (sizes[i] + 15) / 16 * 16;
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
  if (a.weight_grads_pending) fail("internal: an input-only backward over activations whose weight_backward has not run");
  mode_ = mode;
  input_only_pass_ = &a;
  reserve_input_only(a);
  a.deferred.clear();
  a.embed_deferred = false;
  a.kept_used = 0;
  a.weight_grads_pending = true;
}

size_t Model::kept_floats(int B, int T) const {
  // Per block the output gradients of the projection, the MLP input layer, the attention output
  // and QKV; in the classifier head the pooler's (the classifier's own is the logits gradient,
  // which stays in the activations; the LM head's is recomputed by weight_backward).
  const ModelDesc& d = desc;
  const size_t N = static_cast<size_t>(B) * T, C = d.d_model;
  size_t n = (part.l1 - part.l0) * (2 * round16(N * C) + round16(N * d.fc_dim()) + round16(N * d.qkv_dim()));
  if (part.head && d.head == HeadKind::classifier) n += round16(static_cast<size_t>(B) * C);
  return n;
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
  a.deferred.push_back({slot, weight_role, bias_role, dout, inp, inp16, N, C, OC});
}

float* Model::kept_buffer(Activations& a, size_t n) const {
  if (a.kept_used + round16(n) > a.kept_floats) fail("internal: the kept output gradients overflow");
  float* p = a.kept + a.kept_used;
  a.kept_used += round16(n);
  return p;
}

void Model::weight_backward(Activations& a, const ReadyFn& ready) {
  if (!a.weight_grads_pending)
    fail("internal: weight_backward without an input-only backward of these activations");
  // Leave the input-only pass (if it is this one), and track readiness afresh: every tensor
  // without a deferred gradient is final now; the deferred ones as their gradients land.
  mode_ = BackwardMode::whole;
  input_only_pass_ = nullptr;
  tracker_.reset(table);
  std::vector<char> deferred_slice(table.slices.size(), 0);
  for (const Activations::DeferredDense& j : a.deferred)
    for (int r : {j.weight_role, j.bias_role})
      if (r >= 0)
        for (int i : role_slices[j.slot][r]) deferred_slice[i] = 1;
  if (a.embed_deferred)
    for (int r : {kEmbNormW, kEmbNormB, kTypeEmb, kPosEmb, kTokEmb})
      for (int i : role_slices[0][r]) deferred_slice[i] = 1;
  for (size_t i = 0; i < deferred_slice.size(); i++)
    if (!deferred_slice[i]) tracker_.done(i);
  finished(0, {}, ready);
  // dW[OC,C] += dout^T · inp; db[OC] += Σ_n dout (matmul_backward without dinp)
  for (const Activations::DeferredDense& j : a.deferred) {
    const BlockTensors& g = j.slot == 0 ? ge : gb[j.slot - 1];
    const BlockTensors& w = j.slot == 0 ? pe : pb[j.slot - 1];
    if (!j.dout) {  // the chunked LM head: its logits gradient recomputed, chunk by chunk
      lm_head_backward_chunks(a, nullptr, g[j.weight_role]);
      // A tied matrix held with the embedding is final only after the embedding's part (below).
      if (!(a.embed_deferred && j.weight_role == kTokEmb)) finished(j.slot, {j.weight_role}, ready);
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
  if (a.embed_deferred) {
    a.embed_deferred = false;
    embed_backward(a, ready);
  }
  if (!tracker_.complete()) fail("internal: weight_backward left gradients unreported");
  a.deferred.clear();
  a.kept_used = 0;
  a.weight_grads_pending = false;
}

void Model::head_backward(Activations& a, const ReadyFn& ready) {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  ensure_scratch(B, T);
  const float* x = a.output();
  if (!a.head_grad) fail("internal: head_backward after a head_forward without need_grad");
  if (d.head == HeadKind::lm) {
    const bool tied = d.tie_embeddings;
    const int wrole = tied ? kTokEmb : kLmHead;
    if (a.lm_head_fused) {
      // The fused head's forward ran its backward: a.tmp = d xf, dW added (see transformer.h).
      if (mode_ != BackwardMode::whole) fail("internal: an input-only backward after a fused LM head forward");
      if (!(tied && part.embedding)) finished(0, {wrole}, ready);
    } else if (mode_ == BackwardMode::whole) {
      // The chunked head (see transformer.h): d_a_ = d xf now; dW now, or in weight_backward after
      // an input-only pass (recomputing the logits there too: nothing N x V is kept).
      o.zero(d_a_, NC * sizeof(float));
      lm_head_backward_chunks(a, d_a_, ge[wrole]);
      // A tied matrix held with the embedding gets its embedding gradient later in a whole pass.
      if (!(tied && part.embedding)) finished(0, {wrole}, ready);
    } else {
      if (input_only_pass_ != &a) fail("internal: an input-only backward continued on other activations");
      o.zero(d_a_, NC * sizeof(float));
      lm_head_backward_chunks(a, d_a_, nullptr);
      a.deferred.push_back({0, wrole, -1, nullptr, nullptr, nullptr, N, C, d.vocab_rows()});
    }
    const float* dxf = a.lm_head_fused ? a.tmp : d_a_;
    const int Nr = d.residual_rows(N);
    const size_t NrC = static_cast<size_t>(Nr) * C;
    if (d.seq_shards()) {  // each rank's partial d xf of every row, summed onto this rank's rows
      tensor.reduce_scatter(dxf, a.scattered, NrC);
      dxf = a.scattered;
    }
    o.zero(a.dresidual, NrC * sizeof(float));
    if (d.final_norm) {
      norm_backward_rows(a.dresidual, ge[kFinalNormW], ge[kFinalNormB], dxf, x, pe[kFinalNormW], a.final_mean,
                         a.final_rstd, Nr);
      finished(0, {kFinalNormW, kFinalNormB}, ready);
    } else {
      o.copy(a.dresidual, dxf, NrC * sizeof(float));
    }
  } else {
    const size_t BC = static_cast<size_t>(B) * C;
    float *dpd = d_small_, *dpre = d_small_ + BC, *ddrop = d_small_ + 2 * BC;
    const bool drop = a.dropout.training && d.dropout > 0;
    o.zero(dpd, BC * sizeof(float));
    dense_backward(a, dpd, a.logits, true, drop ? a.pooled_drop : a.pooled, nullptr, 0, kClsW, kClsB, B, C, d.num_labels, true,
                   ready);
    if (drop) {
      o.zero(ddrop, BC * sizeof(float));
      o.dropout_backward(ddrop, dpd, BC, d.dropout, drop_key(a, d.n_layer, kDropPooler));
      dpd = ddrop;
    }
    o.zero(dpre, BC * sizeof(float));
    o.tanh_backward(dpre, a.pooled, dpd, BC);
    float* dcls = d_small_;  // dpd is consumed
    o.zero(dcls, BC * sizeof(float));
    dense_backward(a, dcls, dpre, false, a.cls, nullptr, 0, kPoolerW, kPoolerB, B, C, C, true, ready);
    if (!d.seq_shards()) {
      o.zero(a.dresidual, NC * sizeof(float));
      o.first_token_backward(a.dresidual, dcls, B, T, C);
    } else {  // every row's gradient (the same on every rank), then this rank's rows of it
      const int Nr = d.residual_rows(N);
      o.zero(a.tmp, NC * sizeof(float));
      o.first_token_backward(a.tmp, dcls, B, T, C);
      o.copy(a.dresidual, a.tmp + static_cast<size_t>(d.tp_rank) * Nr * C, static_cast<size_t>(Nr) * C * sizeof(float));
    }
  }
}

void Model::lm_head_backward_chunks(Activations& a, float* dxf, float* dW) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int N = a.B * a.T, C = d.d_model, V = d.vocab_rows(), R = a.lm_rows;
  // (sequence parallelism: every row's xf, gathered by the head forward)
  const float* xf = d.seq_shards() ? a.gathered : d.final_norm ? a.final_norm : a.output();
  const uint16_t* xf16 = d.final_norm ? a.final_norm_bf16 : nullptr;  // (xf null then)
  const float* W = d.tie_embeddings ? pe[kTokEmb] : pe[kLmHead];
  GemmMode head_gemm = gemm_reading(W);  // the head forward rounded W
  head_gemm.out_ld = head_gemm.dout_ld = a.logits_ld;
  // the logits gradient is written in bf16, and the GEMMs read it so
  if (a.logits_grad_bf16) head_gemm.dout_bf16 = a.logits_grad_bf16;
  // Per chunk [r0, r0 + rn), last to first: z = xf_c·W^T; z <- d loss/d z = grad_scale/N ·
  // (softmax(z) - onehot(y)) (the losses rewritten with the values head_forward wrote), unless the
  // buffer still holds it (the last chunk after the forward, or the only one; the same bits either
  // way); dxf_c += z·W; dW += z^T·xf_c.
  const int chunks = (N + R - 1) / R;
  const bool reuse = a.lm_last_grad;
  for (int c = chunks - 1; c >= 0; c--) {
    const int r0 = c * R, rn = std::min(R, N - r0);
    const float* xc = xf ? xf + static_cast<size_t>(r0) * C : nullptr;
    GemmMode chunk_gemm = head_gemm;
    chunk_gemm.inp_bf16 = xf16 ? xf16 + static_cast<size_t>(r0) * C : nullptr;
    if (!(reuse && c == chunks - 1)) {
      o.matmul_forward(a.logits, xc, W, nullptr, rn, C, V, chunk_gemm);
      lm_xent(a, r0, rn, a.head_grad_scale / static_cast<float>(N));  // (a fused forward's target check too)
    }
    o.matmul_backward(dxf ? dxf + static_cast<size_t>(r0) * C : nullptr, dW, nullptr,
                      a.logits_grad_bf16 ? nullptr : a.logits, xc, W, rn, C, V, chunk_gemm);
  }
  a.lm_last_grad = chunks == 1;  // the buffer holds chunk 0's gradient now
  // each rank's vocabulary rows' share of d xf, summed (sequence parallelism: head_backward
  // reduce-scatters it instead)
  if (dxf && !d.seq_shards()) tp_sum(dxf, static_cast<size_t>(N) * C);
}

void Model::norm_backward_rows(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                               const float* mean, const float* rstd, int rows) {
  const ModelDesc& d = desc;
  if (!d.seq_shards()) return norm_backward(*ops, d, dx, dw, db, dout, x, w, mean, rstd, rows);
  const int C = d.d_model;
  const bool bias = d.norm == NormKind::layernorm;
  ops->zero(d_norm_, 2 * static_cast<size_t>(C) * sizeof(float));
  norm_backward(*ops, d, dx, d_norm_, bias ? d_norm_ + C : nullptr, dout, x, w, mean, rstd, rows);
  tensor.sum(d_norm_, bias ? 2 * static_cast<size_t>(C) : static_cast<size_t>(C));
  ops->residual_forward(dw, dw, d_norm_, static_cast<size_t>(C));
  if (bias) ops->residual_forward(db, db, d_norm_ + C, static_cast<size_t>(C));
}

void Model::lm_xent(Activations& a, int r0, int rn, float scale) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  uint64_t* bad = &a.scalars->bad_target;
  if (d.tp == 1) {
    if (scale != 0.0f && a.logits_grad_bf16)
      o.softmax_xent_bf16_grad(a.logits, a.logits_ld, a.losses + r0, a.targets + r0, rn, d.vocab_size, scale,
                               a.logits_grad_bf16, bad, r0);
    else
      o.softmax_xent_record(a.logits, a.logits_ld, a.losses + r0, a.targets + r0, rn, d.vocab_size, scale, bad, r0);
    return;
  }
  // Over the group's vocabulary shards ("Tensor parallelism" in transformer.h), the logits never
  // gathered: the rows' maximum (a max over the group), then Σ exp(z - max) and the target's logit
  // (one sum over the group: the target's shard gives it, the others 0), then each rank's losses
  // (the same on every rank) and its columns of the gradient. The ids were checked on the host.
  float* mx = a.xent_stats;
  float* sums = a.xent_stats + a.lm_rows;  // [2 rn]: Σ exp, then the target logits
  const int V = d.vocab_rows(), v0 = d.vocab_begin();
  o.vocab_xent_max(mx, a.logits, a.logits_ld, rn, V);
  tensor.max(mx, static_cast<size_t>(rn));
  o.vocab_xent_sums(sums, a.logits, a.logits_ld, mx, a.targets + r0, v0, rn, V);
  tensor.sum(sums, 2 * static_cast<size_t>(rn));
  o.vocab_xent_finish(a.logits, a.logits_ld, a.losses + r0, mx, sums, a.targets + r0, v0, rn, V, scale);
}

void Model::tp_sum(float* x, size_t n) const {
  if (desc.tp > 1) tensor.sum(x, n);
}

void Model::blocks_backward(Activations& a, int from, int to, const ReadyFn& ready) {
  check_block_range(from, to);
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T, NH = d.heads(), NKV = d.kv_heads(), hs = d.head_dim();
  const int QKV = d.qkv_dim(), F = d.ffn(), FC = d.fc_dim(), AY = NH * hs;
  const int Nr = d.residual_rows(N);                  // the residual stream's rows (see blocks_forward)
  const size_t NC = static_cast<size_t>(Nr) * C, NfC = static_cast<size_t>(N) * C;
  const bool sp = d.seq_shards();
  const float p = a.dropout.training ? d.dropout : 0.0f, pa = a.dropout.training ? d.attn_dropout : 0.0f;
  const int32_t* mask = a.has_mask ? a.attn_mask : nullptr;
  check_attention_state(a, d);
  ensure_scratch(B, T);
  float* dres = a.dresidual;  // holds d(block output); leaves holding d(block input)
  // d(branch output) from d(residual sum): the dropout mask applied to it, or itself.
  auto through_dropout = [&](const float* g, float* into, int l, int site) -> const float* {
    if (p <= 0) return g;
    o.zero(into, NC * sizeof(float));
    o.dropout_backward(into, g, NC, p, hidden_drop_key(a, l, site));
    return into;
  };
  // Sequence parallelism: a gradient on the residual stream's rows all-gathered (the backward of
  // the reduce-scatter after a row-parallel layer), and a branch input gathered again for a
  // column-parallel layer's weight gradient; the rows themselves otherwise.
  auto full_grad = [&](const float* rows) -> const float* {
    if (!sp) return rows;
    tensor.all_gather(rows, d_full_, NC);
    return d_full_;
  };
  auto full_input = [&](const float* rows) -> const float* {
    if (!sp) return rows;
    tensor.all_gather(rows, a.gathered, NC);
    return a.gathered;
  };
  // A column-parallel layer's input gradient, computed by `grad(part)` into the zeroed [N, C]
  // `part` (each rank's share with tensor parallelism), onto the residual stream's rows: summed
  // over the group in place, or reduce-scattered into `rows`. Returns where it is.
  auto to_rows = [&](float* part, float* rows, const std::function<void(float*)>& grad) -> const float* {
    o.zero(part, NfC * sizeof(float));
    grad(part);
    if (sp) {
      tensor.reduce_scatter(part, rows, NC);
      return rows;
    }
    tp_sum(part, NfC);
    return part;
  };
  // An input-only pass writes the gradients of fc and qkv straight into the kept buffers that
  // weight_backward reads (no copy); a whole pass into scratch.
  const bool keep = mode_ == BackwardMode::input_only;
  float *d_fc = d_fc_, *d_qkv = d_qkv_;
  // A block's dense layer (inp [N, in] -> [N, out]; inp16 its bf16 copy where the input is kept
  // only in bf16); its output gradient is d_fc / d_qkv (kept in an input-only pass), or scratch or
  // dres (copied in an input-only pass).
  auto dense = [&](float* dinp, const float* dout, const float* inp, const uint16_t* inp16, int slot, int wrole,
                   int brole, int in, int out) {
    const bool kept = keep && (dout == d_fc || dout == d_qkv);
    dense_backward(a, dinp, dout, kept, inp, inp16, slot, wrole, brole, N, in, out, true, ready);
  };
  // The MLP's output projection and activation, backward: from dproj = d(projection output) to
  // d_fc = d(fc output). The projection's weight and bias gradients go through dense (deferred in
  // an input-only pass); its input gradient d act = dproj·Wproj and the activation's backward are
  // one op for GELU (tanh): matmul_dgelu_backward overwrites d_fc (scratch or a kept buffer that
  // holds nothing else), so d act is never stored. Otherwise d act goes through d_act_.
  auto proj_act_backward = [&](const Activations::Layer& L, const float* dproj, int slot) {
    const BlockTensors& w = pb[slot - 1];
    if (d.mlp == MlpKind::gelu_tanh) {
      dense(nullptr, dproj, L.act, L.act_bf16, slot, kProjW, kProjB, F, C);
      o.matmul_dgelu_backward(d_fc, dproj, w[kProjW], L.fc, N, F, C, gemm_reading(w[kProjW]));
      return;
    }
    o.zero(d_act_, static_cast<size_t>(N) * F * sizeof(float));
    dense(d_act_, dproj, L.act, L.act_bf16, slot, kProjW, kProjB, F, C);
    o.zero(d_fc, static_cast<size_t>(N) * FC * sizeof(float));
    if (d.mlp == MlpKind::gelu_erf)
      o.gelu_erf_backward(d_fc, L.fc, d_act_, static_cast<size_t>(N) * F);
    else
      o.swiglu_backward(d_fc, L.fc, d_act_, N, F);
  };
  auto attention_backward = [&](const Activations::Layer& L, const BlockTensors& w, int l) {
    if (d.attention == AttentionImpl::fused)  // d_a_ = d atty; atty is the (dropped) output
      o.flash_attention_backward(d_qkv, d_a_, L.atty, L.lse, L.qkv, mask, B, T, NH, NKV, hs, d.causal, pa,
                                 attn_drop_key(a, l), precision);
    else
      o.attention_backward(d_qkv, d_att_, d_a_, L.qkv, L.att, mask, B, T, NH, NKV, hs, d.causal, pa,
                           attn_drop_key(a, l));
    if (!d.learned_positions) {
      o.rope_backward(d_qkv, B, T, NH, hs, QKV, static_cast<float>(d.rope_theta));
      o.rope_backward(d_qkv + AY, B, T, NKV, hs, QKV, static_cast<float>(d.rope_theta));
    }
  };
  for (int l = to - 1; l >= from; l--) {
    const int i = l - part.l0, slot = 1 + i;
    const BlockTensors& w = pb[i];
    const BlockTensors& g = gb[i];
    recompute_block(a, l);
    const Activations::Layer& L = a.layers[i];
    const float* x = i == 0 ? a.input : a.layers[i - 1].out;
    if (keep) {
      d_fc = kept_buffer(a, static_cast<size_t>(N) * FC);
      d_qkv = kept_buffer(a, static_cast<size_t>(N) * QKV);
    }
    if (d.pre_norm) {
      // out = res_attn + drop(P act(F N2(res_attn))); dres = d out.
      const float* dproj = full_grad(through_dropout(dres, d_b_, l, kDropMlpOut));
      proj_act_backward(L, dproj, slot);
      const float* h2 = full_input(L.norm2);
      const float* dh2 = to_rows(d_a_, d_b_, [&](float* part) {
        dense(part, d_fc, sp ? h2 : L.norm2, L.norm2_bf16, slot, kFcW, kFcB, C, FC);
      });
      norm_backward_rows(dres, g[kNorm2W], g[kNorm2B], dh2, L.res_attn, w[kNorm2W], L.norm2_mean, L.norm2_rstd, Nr);
      finished(slot, {kNorm2W, kNorm2B}, ready);
      // dres = d res_attn; res_attn = x + drop(O attention(QKV N1(x))).
      const float* dao = full_grad(through_dropout(dres, d_b_, l, kDropAttnOut));
      o.zero(d_a_, NfC * sizeof(float));
      dense(d_a_, dao, L.atty, nullptr, slot, kAttnOutW, kAttnOutB, AY, C);
      o.zero(d_qkv, static_cast<size_t>(N) * QKV * sizeof(float));
      attention_backward(L, w, l);
      const float* h1 = full_input(L.norm1);
      const float* dh1 = to_rows(d_b_, d_a_, [&](float* part) {
        dense(part, d_qkv, sp ? h1 : L.norm1, L.norm1_bf16, slot, kQkvW, kQkvB, C, QKV);
      });
      norm_backward_rows(dres, g[kNorm1W], g[kNorm1B], dh1, x, w[kNorm1W], L.norm1_mean, L.norm1_rstd, Nr);
      finished(slot, {kNorm1W, kNorm1B}, ready);
    } else {
      // out = LN2(res_mlp), res_mlp = h + drop(P act(F h)), h = LN1(res_attn),
      // res_attn = x + drop(O attention(QKV x)); dres = d out.
      o.zero(d_b_, NC * sizeof(float));
      norm_backward_rows(d_b_, g[kNorm2W], g[kNorm2B], dres, L.res_mlp, w[kNorm2W], L.norm2_mean, L.norm2_rstd, Nr);
      finished(slot, {kNorm2W, kNorm2B}, ready);
      const float* dproj = full_grad(through_dropout(d_b_, dres, l, kDropMlpOut));  // dres is free now
      proj_act_backward(L, dproj, slot);
      // d_b_ = d h: the residual's part (in d_b_) plus the MLP's, which with tensor parallelism is
      // summed over the group (or reduce-scattered) on its own first
      if (d.tp == 1) {
        dense(d_b_, d_fc, L.norm1, nullptr, slot, kFcW, kFcB, C, FC);
      } else {
        const float* h = full_input(L.norm1);
        const float* dh = to_rows(d_a_, d_full_, [&](float* part) {
          dense(part, d_fc, h, nullptr, slot, kFcW, kFcB, C, FC);
        });
        o.residual_forward(d_b_, d_b_, dh, NC);
      }
      o.zero(dres, NC * sizeof(float));
      norm_backward_rows(dres, g[kNorm1W], g[kNorm1B], d_b_, L.res_attn, w[kNorm1W], L.norm1_mean, L.norm1_rstd, Nr);
      finished(slot, {kNorm1W, kNorm1B}, ready);
      const float* dao = full_grad(through_dropout(dres, d_b_, l, kDropAttnOut));
      o.zero(d_a_, NfC * sizeof(float));
      dense(d_a_, dao, L.atty, nullptr, slot, kAttnOutW, kAttnOutB, AY, C);
      o.zero(d_qkv, static_cast<size_t>(N) * QKV * sizeof(float));
      attention_backward(L, w, l);
      if (d.tp == 1) {
        dense(dres, d_qkv, x, nullptr, slot, kQkvW, kQkvB, C, QKV);  // dres = d x
      } else {  // (as for d h above)
        const float* xg = full_input(x);
        const float* dx = to_rows(d_b_, d_a_, [&](float* part) {
          dense(part, d_qkv, xg, nullptr, slot, kQkvW, kQkvB, C, QKV);
        });
        o.residual_forward(dres, dres, dx, NC);
      }
    }
  }
}

void Model::embed_backward(Activations& a, const ReadyFn& ready) {
  if (mode_ == BackwardMode::input_only) {
    // Only parameter gradients from here on, nothing flows further: all of it waits for
    // weight_backward (see "Split backward" in transformer.h), from the kept a.dresidual.
    if (input_only_pass_ != &a) fail("internal: an input-only backward continued on other activations");
    a.embed_deferred = true;
    return;
  }
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T, Nr = d.residual_rows(N);
  const size_t NC = static_cast<size_t>(Nr) * C;  // the residual stream's rows
  ensure_scratch(B, T);
  const float* g = a.dresidual;
  if (a.dropout.training && d.dropout > 0) {
    o.zero(d_b_, NC * sizeof(float));
    o.dropout_backward(d_b_, g, NC, d.dropout, hidden_drop_key(a, -1, kDropEmbedding));
    g = d_b_;
  }
  if (d.embedding_norm) {  // (LayerNorm: BERT)
    o.zero(d_a_, NC * sizeof(float));
    norm_backward_rows(d_a_, ge[kEmbNormW], ge[kEmbNormB], g, a.emb_sum, pe[kEmbNormW], a.emb_mean, a.emb_rstd, Nr);
    finished(0, {kEmbNormW, kEmbNormB}, ready);
    g = d_a_;
  }
  if (d.seq_shards()) {  // every row's gradient for the tables (the same on every rank)
    tensor.all_gather(g, d_full_, NC);
    g = d_full_;
  }
  if (d.type_vocab_size > 0) o.embedding_add_backward(ge[kTypeEmb], g, a.token_types, N, C);
  float* dwpe = d.learned_positions ? ge[kPosEmb] : nullptr;
  if (d.tp == 1)
    o.embedding_backward(ge[kTokEmb], dwpe, g, a.tokens, B, T, C);
  else  // this rank's vocabulary rows; the positions' gradient (whole on every rank) from every token
    o.vocab_embedding_backward(ge[kTokEmb], dwpe, g, a.tokens, d.vocab_begin(), d.vocab_rows(), B, T, C);
  finished(0, {kTypeEmb, kPosEmb, kTokEmb}, ready);
}

void Model::backward(Activations& a, const ReadyFn& ready) {
  begin_backward();
  if (part.head) head_backward(a, ready);
  blocks_backward(a, part.l0, part.l1, ready);
  if (part.embedding) embed_backward(a, ready);
  if (!tracker_.complete()) fail("internal: backward left gradients unreported");
}

}  // namespace llmpi
