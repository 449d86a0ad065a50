// What every fused-attention kernel needs of one call — the fp32 kernels (flash_attention.cu) and
// the bf16 tensor-core ones (flash_attention_mma.cu) — and the dropout decision they share with
// the full attention ops (op_list.h): attention element (b, h, i, j) has the index
// e = ((b NH + h) T + i) T + j and is kept when dropout_keep(key, e, p).
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/dropout_hash.h"

namespace llmpi::cuda {

struct FlashArgs {
  int B, T, NH, NKV, hs;
  int W;  // qkv row: (NH + 2 NKV) hs
  int C;  // out row: NH hs
  int G;  // query heads per K/V head
  bool causal;
  float sc;        // 1/sqrt(hs)
  float c;         // the bf16 kernels' base-2 score scale (flash_bf16_score_scale); 0 elsewhere
  float p;         // dropout probability (0: none)
  float inv_keep;  // 1/(1-p)
  uint64_t key;
  bool last_first;  // the forward's and dQ's blocks take the last query tiles first (query_tile_start)
};

inline FlashArgs make_flash_args(int B, int T, int NH, int NKV, int hs, bool causal, float p, uint64_t key) {
  FlashArgs a;
  a.B = B;
  a.T = T;
  a.NH = NH;
  a.NKV = NKV;
  a.hs = hs;
  a.W = (NH + 2 * NKV) * hs;
  a.C = NH * hs;
  a.G = NH / NKV;
  a.causal = causal;
  a.sc = 1.0f / std::sqrt(static_cast<float>(hs));
  a.c = 0.0f;
  a.p = p;
  a.inv_keep = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  a.key = key;
  a.last_first = true;
  return a;
}

// The first query row of this block's tile of `rows` rows (blockIdx.y counts the tiles): with
// last_first the last tiles first, as under a causal mask they have the most keys and blocks start
// in blockIdx order, so the longest start first and the short ones fill the grid's tail.
__device__ __forceinline__ int query_tile_start(const FlashArgs& a, int rows) {
  const int t = static_cast<int>(blockIdx.y);
  return (a.last_first ? (a.T + rows - 1) / rows - 1 - t : t) * rows;
}

// Whether dropout keeps attention element (b, h, i, j) (always, without dropout).
__device__ __forceinline__ bool kept(const FlashArgs& a, int b, int h, int i, int j) {
  if (a.p == 0.0f) return true;
  const uint64_t e =
      ((static_cast<uint64_t>(b) * a.NH + h) * a.T + static_cast<uint64_t>(i)) * a.T + j;
  return dropout_keep(a.key, e, a.p);
}

}  // namespace llmpi::cuda
