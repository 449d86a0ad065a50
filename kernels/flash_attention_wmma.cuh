// The bf16 fused attention through WMMA (kernels/flash_attention_wmma.cu): the version an H100
// verified on 2026-11-24, run by flash_attention_forward/backward (flash_attention.cu) in bf16 when
// the mma.sync path is switched off (LLMPI_CUDA_OFF=mma_attention) and flash_wmma_applies(hs).
// What it rounds: backend/flash_bf16.h, as the mma.sync kernels.
#pragma once
#include <cstdint>

namespace llmpi::cuda {

// True when the bound device can run the WMMA kernels (compute capability >= 8.0, enough opt-in
// shared memory per block) and hs <= 128 (HS = 32, 64 or 128, zero-padded).
bool flash_wmma_applies(int hs);

// The same arguments as the ops (already checked by the caller; B, T, NH, hs > 0).
void flash_wmma_forward(float* out, float* lse, const float* qkv, const int32_t* mask, int B, int T,
                        int NH, int NKV, int hs, bool causal, float dropout_p, uint64_t dropout_key);
// D [B, NH, T]: D_i = dO_i · out_i, computed by the caller (flash_rowdot_kernel).
void flash_wmma_backward(float* dqkv, const float* dout, const float* lse, const float* D,
                         const float* qkv, const int32_t* mask, int B, int T, int NH, int NKV,
                         int hs, bool causal, float dropout_p, uint64_t dropout_key);

}  // namespace llmpi::cuda
