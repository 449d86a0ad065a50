// How a pipeline cuts the model's blocks into virtual stages (pipeline/schedule.h says which
// stage holds which virtual stages): S·v contiguous runs of blocks, the embedding with the first,
// the final norm, the head and the loss with the last.
#pragma once
#include <vector>

#include "model/transformer.h"

namespace llmpi {

// Blocks per virtual stage (K of them): `explicit_counts` when not empty (K counts summing to
// n_layer), else the contiguous split that minimises the most expensive stage, with the embedding
// counted on the first and the head on the last (forward FLOPs per token: 2·params + attention).
// Throws Error naming the fix when impossible.
std::vector<int> split_layers(const ModelDesc& d, int T, int K, const std::vector<int>& explicit_counts);
// The part of the model virtual stage k holds, for those counts.
ModelPart virtual_stage_part(const std::vector<int>& counts, int k);

}  // namespace llmpi
