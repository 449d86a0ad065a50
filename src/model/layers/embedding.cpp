// The embedding ("Tensor parallelism" and "Sequence parallelism" in transformer.h for the shards):
//
//   forward   x0 = [LN_emb]( wte[tokens] + [wpe[t]] + [tte[types]] ), hidden dropout
//             (tp > 1: each rank looks up the vocabulary rows it holds, 0 for the others, and the
//             partial sums are summed over the group, or with sequence parallelism
//             reduce-scattered onto this rank's rows)
//   backward  the dropout mask, LN_emb's backward, then each table row adds the gradient of the
//             positions that read it (dwte[tokens[n]] += g[n], dwpe[t] += Σ_b g[b, t], ...)
#include "model/layers/dropout_keys.h"
#include "model/layers/norm.h"
#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

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

void Model::embed_backward(Activations& a, const ReadyFn& ready) {
  if (mode_ == BackwardMode::input_only) {
    // Only parameter gradients from here on, nothing flows further: all of it waits for
    // weight_backward (see "Split backward" in transformer.h), from the kept a.dresidual.
    if (input_only_pass_ != &a) fail("internal: an input-only backward continued on other activations");
    a.input_only.embed_deferred = true;
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

}  // namespace llmpi
