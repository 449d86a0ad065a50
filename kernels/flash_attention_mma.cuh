// The tensor-core variants of the fused attention (kernels/flash_attention_mma.cu), for bf16 and for
// tf32: called by flash_attention_forward/backward (kernels/flash_attention.cu) when
// flash_mma_applies(prec, hs) holds; otherwise they run their fp32 kernels. What they round:
// backend/flash_bf16.h (bf16: round_to_bf16; tf32: round_to_tf32, at the same points).
#pragma once
#include <cstdint>

#include "backend/gemm_precision.h"

namespace llmpi::cuda {

// The host-side rule: true when prec is bf16 or tf32, hs <= 128 (HS = 32, 64 or 128,
// zero-padded) and the bound device can run the kernels (compute capability >= 8.0, enough
// opt-in shared memory per block for that precision and head size).
bool flash_mma_applies(GemmPrecision prec, int hs);

// The same arguments as the ops (already checked by the caller; B, T, NH, hs > 0).
void flash_mma_forward(GemmPrecision prec, float* out, float* lse, const float* qkv, const int32_t* mask, int B,
                       int T, int NH, int NKV, int hs, bool causal, float dropout_p, uint64_t dropout_key);
// D [B, NH, T]: D_i = dO_i · out_i, computed by the caller (flash_rowdot_kernel).
void flash_mma_backward(GemmPrecision prec, float* dqkv, const float* dout, const float* lse, const float* D,
                        const float* qkv, const int32_t* mask, int B, int T, int NH, int NKV, int hs, bool causal,
                        float dropout_p, uint64_t dropout_key);

}  // namespace llmpi::cuda
