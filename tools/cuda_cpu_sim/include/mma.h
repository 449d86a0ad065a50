// Stand-in for CUDA's <mma.h> (the WMMA API) as kernels/flash_attention_wmma.cu uses it: bf16
// 16x16x16 fragments, fp32 accumulators, row- and column-major operands, row-major accumulator
// loads and stores. WMMA leaves the fragments' layouts across the lanes unspecified, so here every
// lane holds the whole 16x16 matrix: a load or store is a warp barrier, all lanes reading (or
// writing the same values), and another barrier, so the lanes stay in step as the API's
// warp-synchronous contract has them; mma_sync is each lane's own product, d = c + Σ_k a b in k
// order in fp32 (a product of two bf16 values is exact in fp32). What this cannot show: the
// hardware's summation order within a product and the real fragment layouts (the kernels never
// index a fragment's elements).
#pragma once
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the stand-in has 16x16x16 fragments only");
  static constexpr int num_elements = 256;
  T x[256];  // the whole matrix, row-major: A [M][K], B [K][N], C [M][N]
};

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float v) {
  for (auto& e : f.x) e = T(v);
}
template <class Use, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, float v) {
  for (auto& e : f.x) e = __float2bfloat16_rn(v);
}

// element (r, c) of a 16x16 operand at p: row-major p[r ld + c], column-major p[c ld + r]
template <class Layout>
constexpr bool is_col_major() {
  return std::is_same_v<Layout, col_major>;
}

template <class Use, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                             unsigned ld) {
  __syncwarp();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = is_col_major<Layout>() ? p[c * ld + r] : p[r * ld + c];
  __syncwarp();
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ld,
                             layout_t layout) {
  __syncwarp();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = layout == mem_col_major ? p[c * ld + r] : p[r * ld + c];
  __syncwarp();
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ld,
                              layout_t layout) {
  __syncwarp();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) (layout == mem_col_major ? p[c * ld + r] : p[r * ld + c]) = f.x[r * 16 + c];
  __syncwarp();
}

template <class LayoutA, class LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; k++) s += __bfloat162float(a.x[i * 16 + k]) * __bfloat162float(b.x[k * 16 + j]);
      out[i * 16 + j] = s;
    }
  for (int e = 0; e < 256; e++) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
