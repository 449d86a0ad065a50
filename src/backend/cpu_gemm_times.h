// What runtime.cpu_fp32_gemm / runtime.cpu_bf16_gemm "auto" times and finds (backend/cpu/gemm_auto.h),
// apart from the CPU backend so that the trainer's options (train/trainer.h) can name them.
#pragma once

namespace llmpi {

// One dense layer's GEMMs as a Model runs them: out[rows, out] = inp[rows, in] · W[out, in]^T
// (matmul_forward's N, C, OC) and its backward's two (matmul_backward: dinp, dweight), `count`
// times per training step (the layers and micro-batches of that shape; model/dense_layers.h).
struct DenseShape {
  int rows = 0, in = 0, out = 0;
  int count = 1;
};

// Estimated seconds of one training step's dense-layer GEMMs (forward and backward) on oneDNN and
// on the other engine (fp32: OpenBLAS sgemm; bf16: the emulation); < 0: not timed.
struct CpuGemmTimes {
  double onednn_s = -1, fallback_s = -1;
};

}  // namespace llmpi
