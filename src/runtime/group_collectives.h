// The collectives a tensor-parallel Model calls (model/transformer.h "Tensor parallelism"), as
// functions handed down to it: the model runs them without knowing how they travel
// (comm/tensor_group.h makes them over a group's communicator). In place over n floats of the
// model's backend memory, every rank of the group ending with the same bits.
#pragma once
#include <cstddef>
#include <functional>

namespace llmpi {

struct TensorGroup {
  using Fn = std::function<void(float*, size_t)>;
  Fn sum;  // x = Σ over the group's ranks
  Fn max;  // x = max over the group's ranks
  // Sequence parallelism, pieces of n floats: all_gather(piece, whole, n): whole[r·n, (r+1)·n) =
  // rank r's piece; reduce_scatter(whole, piece, n): piece = Σ over ranks of their whole's piece
  // of this rank. The buffers do not overlap.
  using PieceFn = std::function<void(const float*, float*, size_t)>;
  PieceFn all_gather, reduce_scatter;
};

}  // namespace llmpi
