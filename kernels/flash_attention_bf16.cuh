// The bf16 tensor-core variant of the fused attention (kernels/flash_attention_bf16.cu), called by
// flash_attention_forward/backward (kernels/flash_attention.cu) when prec == bf16 and
// flash_bf16_applies(hs) holds; otherwise they run their fp32 kernels. What it rounds:
// backend/flash_bf16.h.
#pragma once
#include <cstdint>

#include "backend/gemm_precision.h"

namespace llmpi::cuda {

// The host-side rule: true when the bound device can run the bf16 kernels (compute capability
// >= 8.0, enough opt-in shared memory per block) and hs <= 128 (HS = 32, 64 or 128, zero-padded).
bool flash_bf16_applies(int hs);

// The same arguments as the ops (already checked by the caller; B, T, NH, hs > 0).
void flash_bf16_forward(float* out, float* lse, const float* qkv, const int32_t* mask, int B, int T,
                        int NH, int NKV, int hs, bool causal, float dropout_p, uint64_t dropout_key);
// D [B, NH, T]: D_i = dO_i · out_i, computed by the caller (flash_rowdot_kernel).
void flash_bf16_backward(float* dqkv, const float* dout, const float* lse, const float* D,
                         const float* qkv, const int32_t* mask, int B, int T, int NH, int NKV,
                         int hs, bool causal, float dropout_p, uint64_t dropout_key);

}  // namespace llmpi::cuda
