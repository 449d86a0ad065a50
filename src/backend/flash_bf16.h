// The bf16 fused attention (runtime.precision=bf16 with fused attention): what it rounds and the
// constants both of its implementations use, so that the CUDA kernels (kernels/flash_attention_mma.cu,
// tensor cores through mma.sync) and the CPU backend's emulation (backend/cpu/attention.cpp) compute
// the same function up to fp32 summation order.
//
// tf32 (runtime.precision=tf32) is the same function with every "bf16(x)" below read as
// round_to_tf32(x) (backend/tf32.h: an 11-bit significand, to nearest with ties away from zero,
// what the kernels' cvt.rna.tf32.f32 does): a product of two tf32 values is exact in fp32 too.
//
// Scores are handled in base 2: t_ij = c (q_i · k_j) with c = log2(e) / sqrt(hs) (one fp32 multiply
// of the fp32 dot product), so exp(S_ij - x) = 2^(t_ij - x log2 e).
//
// forward   q, k, v rounded to bf16 (round to nearest even, backend/bf16.h). Per query row, the
//           running maximum M is kept as an INTEGER, M = ceil(max_j t_ij) over the visible keys
//           seen so far, so the online-softmax rescaling 2^(M_old - M_new) is a power of two and
//           exact: the operand of the P V product, bf16(2^(t_ij - M)) keep_ij, is the same whatever
//           the key tiling (M ends as ceil of the row's maximum). out = (Σ_j bf16(2^(t_ij - M))
//           keep_ij bf16(v_j)) (1/(1-p)) / l_r with l_r = Σ_j bf16(2^(t_ij - M)) over the visible
//           keys (dropped ones included): the rounded weights are normalised by their own sum, so
//           a row dominated by one key (or with one visible key) does not carry that key's
//           rounding error, up to 2^-9 relative, into the whole output row. lse = (M + log2 l) ln 2
//           with l = Σ_j 2^(t_ij - M) unrounded (fp32), so that the backward's P = exp(S - lse).
// backward  q, k, v, dO rounded to bf16; P_ij = 2^(t_ij - lse_i log2 e) (fp32),
//           P~ = P keep/(1-p), D_i = dO_i · out_i (fp32, unrounded operands),
//           dV_j += Σ_i bf16(P~_ij) bf16(dO_i);  dP~_ij = bf16(dO_i) · bf16(v_j);
//           dS'_ij = bf16(sc (P~_ij dP~_ij - P_ij D_i))  (sc = 1/sqrt(hs) folded in before rounding);
//           dQ_i += Σ_j dS'_ij bf16(k_j);  dK_j += Σ_i dS'_ij bf16(q_i).
// Every product of two bf16 values is exact in fp32 and every sum is fp32.
#pragma once
#include <cmath>

namespace llmpi {

constexpr float kFlashLog2e = 1.44269504088896340736f;
constexpr float kFlashLn2 = 0.693147180559945309417f;

// c = log2(e) / sqrt(hs), the factor from a dot product q·k to the base-2 score t.
inline float flash_bf16_score_scale(int hs) {
  return (1.0f / std::sqrt(static_cast<float>(hs))) * kFlashLog2e;
}

}  // namespace llmpi
