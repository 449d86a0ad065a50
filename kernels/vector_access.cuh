// 128-bit memory access for the row and elementwise kernels.
//
// A kernel templated on V (1 or 4) moves V consecutive floats as one access: with V = 4 a warp's
// load of one float4 per lane is a single 512-byte transaction, a quarter of the load/store
// instructions of V = 1. Element c of a row then belongs to the lane that owns quad c / V, so the
// kernels sum in the order "quads q = lane, lane + 32, ...; within a quad, in index order". With
// V = 1 that is exactly the scalar kernels' order (c = lane, lane + 32, ...), so V = 1 keeps their
// bits. V = 4 needs every row pointer 16-byte aligned and the row length a multiple of 4: the host
// checks both (vec4_rows) and otherwise launches V = 1. backend allocations are aligned to >= 64
// bytes (op_list.h), so this fails only for odd C or a pointer offset into a buffer by a
// non-multiple of 4 floats.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

namespace llmpi::cuda {

template <int V>
struct alignas(sizeof(float) * V) Floats {
  float v[V];
};

template <int V>
__device__ __forceinline__ Floats<V> load_floats(const float* p) {
  return *reinterpret_cast<const Floats<V>*>(p);
}

template <int V>
__device__ __forceinline__ void store_floats(float* p, const Floats<V>& x) {
  *reinterpret_cast<Floats<V>*>(p) = x;
}

// load_floats<V> where p is 16-byte aligned, else the same V floats one by one (for an operand
// whose alignment may differ from the rows' that decided V).
template <int V>
__device__ __forceinline__ Floats<V> load_floats_any(const float* p, bool aligned) {
  if constexpr (V == 1) return load_floats<V>(p);
  if (aligned) return load_floats<V>(p);
  Floats<V> r;
#pragma unroll
  for (int j = 0; j < V; j++) r.v[j] = p[j];
  return r;
}

// V output values: fp32 into o and / or their bf16 rounding (round to nearest even) into o16
// (either may be null: the out_bf16 of op_list.h's norms and activations). With V = 4 the bf16
// store is one 8-byte access (o16 8-byte aligned).
template <int V>
__device__ __forceinline__ void store_floats_bf16(float* o, __nv_bfloat16* o16, const Floats<V>& v) {
  if (o) store_floats<V>(o, v);
  if (!o16) return;
  if constexpr (V == 4) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.v[0], v.v[1]), hi = __floats2bfloat162_rn(v.v[2], v.v[3]);
    uint2 u;  // (built from two 4-byte values: no 8-byte read of a 4-byte-aligned local)
    u.x = *reinterpret_cast<const unsigned*>(&lo);
    u.y = *reinterpret_cast<const unsigned*>(&hi);
    *reinterpret_cast<uint2*>(o16) = u;
  } else {
#pragma unroll
    for (int j = 0; j < V; j++) o16[j] = __float2bfloat16_rn(v.v[j]);
  }
}

// True when rows of `len` floats starting at each of `ptrs` (null ones ignored) can be read as
// float4: len a multiple of 4 and every pointer 16-byte aligned.
inline bool vec4_rows(long long len, std::initializer_list<const void*> ptrs) {
  if (len % 4 != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace llmpi::cuda
