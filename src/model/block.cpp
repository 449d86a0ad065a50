// The blocks: the sublayers of model/layers/ wired into a pre-norm (gpt2, llama) or post-norm
// (bert) block, forward, recomputation and backward (the contracts are transformer.h's).
//
//   pre-norm   res_attn = x + drop(attn(N1(x)))          out = res_attn + drop(mlp(N2(res_attn)))
//   post-norm  res_attn = x + drop(attn(x)), h = LN1(res_attn)      out = LN2(h + drop(mlp(h)))
//
// Each residual add with its following norm is one fused op (residual_norm_forward).
#include "model/layers/dropout_keys.h"
#include "model/layers/norm.h"
#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

// The activations hold the attention state of the model's attention implementation (a desc
// changed after they were allocated would leave att/lse null or too small).
void check_attention_state(const Activations& a, const ModelDesc& d) {
  if (a.attention != d.attention)
    fail("internal: activations allocated for ", attention_impl_name(a.attention), " attention, but the model runs ",
         attention_impl_name(d.attention), " attention (allocate them again)");
}

// d(branch output) from d(residual sum) g over n floats: the dropout mask applied into `into`,
// or g itself without dropout.
const float* through_dropout(const Ops& o, const Activations& a, const float* g, float* into, size_t n, int l,
                             int site) {
  const float p = a.dropout.training ? a.model->desc.dropout : 0.0f;
  if (p <= 0) return g;
  o.zero(into, n * sizeof(float));
  o.dropout_backward(into, g, n, p, hidden_drop_key(a, l, site));
  return into;
}

// Block l of m as a's pass sees it: its parameters and gradients, its activations and its input.
struct BlockRefs {
  const BlockTensors& w;
  const BlockTensors& g;
  Activations::Layer& L;
  const float* x;
  int Nr;  // rows of the residual stream (ModelDesc::residual_rows)
};
BlockRefs block_refs(const Model& m, Activations& a, int l) {
  const int i = l - m.part.l0;
  return {m.pb[i], m.gb[i], a.layers[i], i == 0 ? a.input : a.layers[i - 1].out, m.desc.residual_rows(a.B * a.T)};
}

}  // namespace

ParallelRegions Model::regions(const Activations& a) const {
  const size_t N = static_cast<size_t>(a.B) * a.T, C = static_cast<size_t>(desc.d_model);
  return {desc, tensor, static_cast<size_t>(desc.residual_rows(static_cast<int>(N))) * C, N * C};
}

// The row-parallel output in a.tmp onto the residual stream's rows (ParallelRegions::leave_row),
// then the hidden dropout of `site`.
const float* Model::branch_output(Activations& a, int l, int site) const {
  const ParallelRegions pr = regions(a);
  float* out = pr.leave_row(a.tmp, a.scattered);
  const float p = a.dropout.training ? desc.dropout : 0.0f;
  if (p > 0) ops->dropout_forward(out, out, pr.row_floats, p, hidden_drop_key(a, l, site));
  return out;
}

void Model::check_block_range(int from, int to) const {
  if (from < part.l0 || to > part.l1 || from > to)
    fail("internal: blocks [", from, ", ", to, ") are not within the part's [", part.l0, ", ", part.l1, ")");
}

// A bf16 pre-norm model keeps the norms' outputs only in bf16 (norm1 null, norm1_bf16 the GEMM's input).
void Model::block_forward_pre_norm(Activations& a, int l) const {
  const auto [w, g, L, x, Nr] = block_refs(*this, a, l);
  norm_forward(*ops, desc, L.norm1, L.norm1_bf16, L.norm1_mean, L.norm1_rstd, x, w[kNorm1W], w[kNorm1B], Nr);
  const float* attn_out = attention_forward(a, l, L.norm1, L.norm1_bf16);
  residual_norm_forward(*ops, desc, L.res_attn, L.norm2, L.norm2_bf16, L.norm2_mean, L.norm2_rstd, x, attn_out,
                        w[kNorm2W], w[kNorm2B], Nr);
  const float* mlp_out = mlp_forward(a, l, L.norm2, L.norm2_bf16);
  ops->residual_forward(L.res_mlp, L.res_attn, mlp_out, regions(a).row_floats);  // (L.out is res_mlp)
}

void Model::block_forward_post_norm(Activations& a, int l) const {
  const auto [w, g, L, x, Nr] = block_refs(*this, a, l);
  const float* attn_out = attention_forward(a, l, x, nullptr);
  residual_norm_forward(*ops, desc, L.res_attn, L.norm1, nullptr, L.norm1_mean, L.norm1_rstd, x, attn_out,
                        w[kNorm1W], w[kNorm1B], Nr);
  const float* mlp_out = mlp_forward(a, l, L.norm1, nullptr);
  residual_norm_forward(*ops, desc, L.res_mlp, L.out, nullptr, L.norm2_mean, L.norm2_rstd, L.norm1, mlp_out,
                        w[kNorm2W], w[kNorm2B], Nr);
}

void Model::blocks_forward(Activations& a, int from, int to) const {
  check_block_range(from, to);
  check_attention_state(a, desc);
  for (int l = from; l < to; l++) {
    if (desc.pre_norm)
      block_forward_pre_norm(a, l);
    else
      block_forward_post_norm(a, l);
    a.shared_layer = l;
  }
}

// Recomputation ("Activation recomputation" in transformer.h): full runs the block's forward
// again; selective the forward's ops on the kept operands, so the same bits.
void Model::recompute_block(Activations& a, int l) const {
  if (recompute == Recompute::none || a.shared_layer == l) return;
  if (recompute == Recompute::full) return blocks_forward(a, l, l + 1);  // (sets shared_layer)
  if (desc.pre_norm) {
    // norm2 was written by the fused residual + norm op, whose bits are those of the norm of res_attn
    const auto [w, g, L, x, Nr] = block_refs(*this, a, l);
    norm_forward(*ops, desc, L.norm1, L.norm1_bf16, L.norm1_mean, L.norm1_rstd, x, w[kNorm1W], w[kNorm1B], Nr);
    norm_forward(*ops, desc, L.norm2, L.norm2_bf16, L.norm2_mean, L.norm2_rstd, L.res_attn, w[kNorm2W],
                 w[kNorm2B], Nr);
  }
  attention_recompute(a, l);
  mlp_recompute(a, l);
  a.shared_layer = l;
}

void Model::block_dense(Activations& a, const BlockPass& p, float* dinp, const float* dout, const float* inp,
                        const uint16_t* inp16, int weight_role, int bias_role, int in, int out) {
  const bool kept = mode_ == BackwardMode::input_only && (dout == p.d_fc || dout == p.d_qkv);
  dense_backward(a, dinp, dout, kept, inp, inp16, p.slot, weight_role, bias_role, a.B * a.T, in, out, true, p.ready);
}

// a.dresidual = d out on entry, d x on return (out = res_attn + mlp branch, res_attn = x + attention branch).
void Model::block_backward_pre_norm(Activations& a, const BlockPass& p) {
  const auto [w, g, L, x, Nr] = block_refs(*this, a, p.l);
  float* dres = a.dresidual;
  const size_t NC = regions(a).row_floats;
  const float* dh2 = mlp_backward(a, p, through_dropout(*ops, a, dres, d_b_, NC, p.l, kDropMlpOut), L.norm2,
                                  L.norm2_bf16, {d_a_, d_b_, nullptr});
  norm_backward_rows(dres, g[kNorm2W], g[kNorm2B], dh2, L.res_attn, w[kNorm2W], L.norm2_mean, L.norm2_rstd, Nr);
  finished(p.slot, {kNorm2W, kNorm2B}, p.ready);
  // dres = d res_attn
  const float* dh1 = attention_backward(a, p, through_dropout(*ops, a, dres, d_b_, NC, p.l, kDropAttnOut), L.norm1,
                                        L.norm1_bf16, {d_b_, d_a_, nullptr});
  norm_backward_rows(dres, g[kNorm1W], g[kNorm1B], dh1, x, w[kNorm1W], L.norm1_mean, L.norm1_rstd, Nr);
  finished(p.slot, {kNorm1W, kNorm1B}, p.ready);
}

// a.dresidual = d out on entry, d x on return (out = LN2(res_mlp), res_mlp = h + mlp branch,
// h = LN1(res_attn), res_attn = x + attention branch); each branch's input gradient is added to
// the residual's (acc).
void Model::block_backward_post_norm(Activations& a, const BlockPass& p) {
  const auto [w, g, L, x, Nr] = block_refs(*this, a, p.l);
  float* dres = a.dresidual;
  const size_t NC = regions(a).row_floats;
  ops->zero(d_b_, NC * sizeof(float));  // d_b_ = d res_mlp
  norm_backward_rows(d_b_, g[kNorm2W], g[kNorm2B], dres, L.res_mlp, w[kNorm2W], L.norm2_mean, L.norm2_rstd, Nr);
  finished(p.slot, {kNorm2W, kNorm2B}, p.ready);
  // (dres is free now); d_b_ becomes d h
  mlp_backward(a, p, through_dropout(*ops, a, d_b_, dres, NC, p.l, kDropMlpOut), L.norm1, nullptr,
               {d_a_, d_full_, d_b_});
  ops->zero(dres, NC * sizeof(float));  // dres = d res_attn, then d x
  norm_backward_rows(dres, g[kNorm1W], g[kNorm1B], d_b_, L.res_attn, w[kNorm1W], L.norm1_mean, L.norm1_rstd, Nr);
  finished(p.slot, {kNorm1W, kNorm1B}, p.ready);
  attention_backward(a, p, through_dropout(*ops, a, dres, d_b_, NC, p.l, kDropAttnOut), x, nullptr,
                     {d_b_, d_a_, dres});
}

void Model::blocks_backward(Activations& a, int from, int to, const ReadyFn& ready) {
  check_block_range(from, to);
  check_attention_state(a, desc);
  ensure_scratch(a.B, a.T);
  const size_t N = static_cast<size_t>(a.B) * a.T;
  for (int l = to - 1; l >= from; l--) {
    recompute_block(a, l);
    // An input-only pass writes the gradients of fc and qkv straight into the kept buffers that
    // weight_backward reads (no copy); a whole pass into scratch.
    BlockPass p{l, 1 + l - part.l0, d_fc_, d_qkv_, ready};
    if (mode_ == BackwardMode::input_only) {
      p.d_fc = kept_buffer(a, N * desc.fc_dim());
      p.d_qkv = kept_buffer(a, N * desc.qkv_dim());
    }
    if (desc.pre_norm)
      block_backward_pre_norm(a, p);
    else
      block_backward_post_norm(a, p);
  }
}

}  // namespace llmpi
