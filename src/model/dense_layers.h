// The dense layers a Model runs (model/transformer.h), as shapes: what runtime.cpu_fp32_gemm and
// runtime.cpu_bf16_gemm "auto" time (backend/cpu/gemm_auto.h).
#pragma once
#include <vector>

#include "backend/cpu_gemm_times.h"
#include "model/transformer.h"

namespace llmpi {

// The dense layers of `part` of the model d (a rank's shard with tensor parallelism) in a training
// forward of B x T tokens, as Model calls matmul_forward (rows, in, out: QKV, attention output, MLP
// in and out per block; the LM head per chunk of lm_head_chunk_rows rows, or the pooler and the
// classifier), each with how many of the part's layers share it. Its backward runs matmul_backward
// on the same shapes.
std::vector<DenseShape> dense_layers(const ModelDesc& d, const ModelPart& part, int B, int T);

}  // namespace llmpi
