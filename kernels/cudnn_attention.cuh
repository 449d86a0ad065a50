// Fused attention through cuDNN's scaled-dot-product-attention graphs (kernels/cudnn_attention.cpp),
// run by flash_attention_forward/backward (flash_attention.cu) in bf16 where
// cudnn_attention_applies(): cuDNN is loaded at run time (dlopen of libcudnn.so.9: a binary runs
// where it is absent, and says why it is not used), the path is on (LLMPI_CUDA_OFF without
// cudnn_attention), dropout is 0 (cuDNN's dropout draws from its own generator, which cannot
// give dropout_keep's mask) and there is no key padding mask (cuDNN's backward through a padding
// bias was wrong on an H100). Our kernels stay for those, for the calls cuDNN refuses, and as the
// oracle. Run on an H100 (2026-11-27).
#pragma once
#include <cstdint>

#include "backend/gemm_precision.h"

namespace llmpi::cuda {

// bf16, dropout 0, hs a multiple of 8 and <= 128, NH a multiple of NKV, cuDNN loadable, the path on.
bool cudnn_attention_applies(GemmPrecision prec, int NH, int NKV, int hs, float dropout_p);

// The ops' contracts (op_list.h, flash_attention_forward/backward with prec bf16, dropout 0, no
// padding mask). They
// return false, having enqueued nothing, when cuDNN has no plan for the call's shape (its reason
// is printed once per shape on stderr); the caller then runs its own kernels.
bool cudnn_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int hs,
                             bool causal);
bool cudnn_attention_backward(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv,
                              int B, int T, int NH, int NKV, int hs, bool causal);

}  // namespace llmpi::cuda
