// The MLP branch of a block, by desc.mlp ("Tensor parallelism" in transformer.h for the shards):
//
//   forward   fc = h·Wfc^T + bfc                 column-parallel: this rank's ffn_dim / tp channels
//             act = gelu_tanh(fc) | gelu_erf(fc) | silu(gate) ⊙ up (SwiGLU: fc = [gate, up])
//             out = act·Wp^T + bp                row-parallel: each rank's partial sum, bp on rank 0
//   backward  dact = dout·Wp, dWp += dout^T·act, dbp += Σ dout
//             dfc = act'(fc) ⊙ dact              (GELU tanh: one op from dout, dact never stored)
//             dh = dfc·Wfc, dWfc += dfc^T·h, dbfc += Σ dfc
#include <algorithm>

#include "backend/dropout_hash.h"
#include "model/transformer.h"

namespace llmpi {

const float* Model::mlp_forward(Activations& a, int l, const float* h, const uint16_t* h16) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int C = d.d_model, N = a.B * a.T, F = d.ffn(), FC = d.fc_dim();
  const BlockTensors& w = pb[l - part.l0];
  Activations::Layer& L = a.layers[l - part.l0];
  h = regions(a).enter_column(h, a.gathered);
  GemmMode fc_gemm = gemm_rounding(w[kFcW], static_cast<size_t>(FC) * C);
  fc_gemm.inp_bf16 = h16;
  switch (d.mlp) {  // GELU (tanh) is fused with its dense layer (a cuBLASLt epilogue on CUDA)
    case MlpKind::gelu_tanh:
      o.matmul_gelu_forward(L.fc, L.act, h, w[kFcW], w[kFcB], N, C, FC, fc_gemm, L.act_bf16);
      break;
    case MlpKind::gelu_erf:
      o.matmul_forward(L.fc, h, w[kFcW], w[kFcB], N, C, FC, fc_gemm);
      o.gelu_erf_forward(L.act, L.fc, static_cast<size_t>(N) * F, L.act_bf16);
      break;
    case MlpKind::swiglu:
      o.matmul_forward(L.fc, h, w[kFcW], w[kFcB], N, C, FC, fc_gemm);
      o.swiglu_forward(L.act, L.fc, N, F, L.act_bf16);
      break;
  }
  GemmMode proj_gemm = gemm_rounding(w[kProjW], static_cast<size_t>(C) * F);
  proj_gemm.inp_bf16 = L.act_bf16;
  o.matmul_forward(a.tmp, L.act, w[kProjW], d.tp_rank == 0 ? w[kProjB] : nullptr, N, F, C, proj_gemm);
  return branch_output(a, l, kDropMlpOut);
}

// act again from the kept fc, by the forward's elementwise op (the same bits; see transformer.h
// "Activation recomputation" for GELU tanh's one exception on CUDA).
void Model::mlp_recompute(Activations& a, int l) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int N = a.B * a.T, F = d.ffn();
  Activations::Layer& L = a.layers[l - part.l0];
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
}

const float* Model::mlp_backward(Activations& a, const BlockPass& p, const float* dout, const float* h,
                                 const uint16_t* h16, InputGrad ig) {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int C = d.d_model, N = a.B * a.T, F = d.ffn(), FC = d.fc_dim();
  const BlockTensors& w = pb[p.l - part.l0];
  const Activations::Layer& L = a.layers[p.l - part.l0];
  const ParallelRegions pr = regions(a);
  const float* dproj = pr.leave_row_backward(dout, d_full_);
  // The projection's weight and bias gradients through block_dense (deferred in an input-only
  // pass). GELU (tanh): dact and the activation's backward are one op, matmul_dgelu_backward,
  // which overwrites d_fc (scratch, or a kept buffer that holds nothing else). Otherwise dact
  // goes through d_act_.
  if (d.mlp == MlpKind::gelu_tanh) {
    block_dense(a, p, nullptr, dproj, L.act, L.act_bf16, kProjW, kProjB, F, C);
    o.matmul_dgelu_backward(p.d_fc, dproj, w[kProjW], L.fc, N, F, C, gemm_reading(w[kProjW]));
  } else {
    o.zero(d_act_, static_cast<size_t>(N) * F * sizeof(float));
    block_dense(a, p, d_act_, dproj, L.act, L.act_bf16, kProjW, kProjB, F, C);
    o.zero(p.d_fc, static_cast<size_t>(N) * FC * sizeof(float));
    if (d.mlp == MlpKind::gelu_erf)
      o.gelu_erf_backward(p.d_fc, L.fc, d_act_, static_cast<size_t>(N) * F);
    else
      o.swiglu_backward(p.d_fc, L.fc, d_act_, N, F);
  }
  const float* hg = pr.enter_column(h, a.gathered);  // (gathered again for the weight gradient)
  return pr.enter_column_backward(ig.part, ig.rows, ig.acc, o, [&](float* dh) {
    block_dense(a, p, dh, p.d_fc, hg, h16, kFcW, kFcB, C, FC);
  });
}

}  // namespace llmpi
