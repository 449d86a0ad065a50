// The keys of the dropout masks of one forward (counter-based, backend/dropout_hash.h): by the
// forward's DropoutContext, the layer (-1: the embedding; n_layer: the classifier head) and the
// site (DropoutSite). A backward and a recompute ask for the same key, so they apply the same
// mask.
#pragma once
#include <cstdint>

#include "backend/dropout_hash.h"
#include "model/transformer.h"

namespace llmpi {

inline uint64_t drop_key(const Activations& a, int layer, int site) {
  const DropoutContext& c = a.dropout;
  return dropout_key(c.seed, c.step, c.rank, c.micro_batch, layer, site);
}

// Hidden dropout on the residual stream's rows: with sequence parallelism each rank holds its own
// rows, so each draws from its own stream (the masks of one rank's distribution, not the same
// masks); otherwise drop_key, the same on every rank of a tensor-parallel group.
inline uint64_t hidden_drop_key(const Activations& a, int layer, int site) {
  const uint64_t k = drop_key(a, layer, site);
  const ModelDesc& d = a.model->desc;
  return d.seq_shards() ? mix64(k ^ (0xbf58476d1ce4e5b9ull * static_cast<uint64_t>(d.tp_rank + 1))) : k;
}

// Attention-probability dropout: its mask is indexed by this rank's heads, so each shard of a
// tensor-parallel group draws from its own stream (masks of the same distribution as one rank's,
// not the same masks); every other mask is the same on every rank of the group.
inline uint64_t attn_drop_key(const Activations& a, int layer) {
  const uint64_t k = drop_key(a, layer, kDropAttnProbs);
  const ModelDesc& d = a.model->desc;
  return d.tp > 1 ? mix64(k ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(d.tp_rank + 1))) : k;
}

}  // namespace llmpi
