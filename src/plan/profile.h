// llmpi-plan --profile: a short in-process measurement of the per-layer costs on this machine's CPU
// backend, with the Model API exactly as training runs it: the embedding alone, one block, the
// head with its loss (each a ModelPart), at one micro-batch of B × T tokens; forward, whole
// backward, input-only backward (zb-h1's BI) and the deferred weight gradients (W); and one AdamW
// update over the block's parameters. Each is timed `reps` times (after one warm-up) and the
// median kept. Threads: `threads` OpenMP/OpenBLAS threads (the cores one rank would get).
#pragma once
#include "model/model_desc.h"
#include "plan/plan.h"

namespace llmpi {

LayerCosts measure_profile(const ModelDesc& d, int micro_batch, int T, int reps, int threads);

}  // namespace llmpi
