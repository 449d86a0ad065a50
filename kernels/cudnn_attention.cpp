// Fused attention through cuDNN's scaled-dot-product-attention graphs (kernels/cudnn_attention.cuh),
// built with cuDNN's C++ frontend (header-only: the Makefile fetches the nvidia-cudnn-frontend
// wheel's headers at build time) in its dynamic-loading mode: libcudnn.so.9 is opened with dlopen
// at the first call, so no binary links it and one runs where it is absent (the path then says
// why it is off). Run on an H100 (2026-11-27): docs/GPU.md "What has been verified, on which card".
//
// What cuDNN computes (bf16 in and out, fp32 softmax and accumulation), mapped onto the ops'
// contract (op_list.h flash_attention_forward/backward):
//   Q, K, V   the qkv activations rounded to bf16 (to_bf16_values) into scratch, read in place with
//             strides: dims [B, heads, T, hs], strides [T W, hs, W, 1] (W = (NH + 2 NKV) hs), K and
//             V at column offsets NH hs and (NH + NKV) hs; grouped K/V heads are cuDNN's own (NKV
//             heads, NH a multiple).
//   mask      causal: the top-left diagonal band (key j visible to query i when j <= i). No key
//             padding mask: through an additive bias [B, 1, 1, T] cuDNN's forward met the contract
//             but its backward's dQ, dK, dV were off by O(1) on an H100, so a padding mask (BERT)
//             runs our kernels.
//   out       cuDNN's O in bf16 [B, T, NH hs], widened to fp32 (so out holds bf16 values).
//   lse       cuDNN's Stats, fp32 [B, NH, T, 1]: log Σ_j exp(S_ij) in natural log, the contract's.
//   backward  out and dout rounded to bf16 (out is exact: it holds bf16 values), Stats = lse,
//             set_deterministic_algorithm(true) (no atomics: the same bits run to run, as the
//             project's determinism rule asks; the test checks it on the card); dQ, dK, dV in bf16
//             into a [B, T, W] scratch laid out as qkv, then widened and ADDED to dqkv (+=).
// So against our bf16 kernels (backend/flash_bf16.h) the output and the gradients are each rounded
// to bf16 once more (relative 2^-9), and cuDNN's own rounding points differ: tests compare it
// with the CPU's bf16 emulation at bounds argued in tests/test_cuda_cudnn_attention.cpp.
// Graphs are built once per shape (B, T, heads, hs, causal) and cached; a shape cuDNN has
// no plan for is remembered, its reason printed once, and the caller runs its own kernels.
//
// Host code only (the conversions around the library call are matmul.cu's kernels): compiled by
// the C++ compiler, once, not by nvcc for each card generation — the frontend's headers are most
// of its compile time (g++ 64 s against nvcc's ~200 s for sm_80 + sm_90).
#define LLMPI_CUDA_HOST_ONLY 1
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>  // (the frontend's headers use std::strlen without it)
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "cuda_common.cuh"
#include "cudnn_attention.cuh"
#include "runtime/error.h"

#if LLMPI_HAVE_CUDNN_FRONTEND
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's dynamic loading reads libcudnn's symbols from it
}
#endif

namespace llmpi::cuda {

namespace {

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// ---- loading libcudnn --------------------------------------------------------------------------

struct Loaded {
  bool ok = false;
  std::string why;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
#if !LLMPI_HAVE_CUDNN_FRONTEND
    r.why = "built without cuDNN's frontend headers (make fetches the nvidia-cudnn-frontend wheel from PyPI; "
            "it was not reachable at build time)";
#else
    // The frontend opens the CUDA runtime itself by name: point it at the one this binary uses.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) != 0 && info.dli_fname != nullptr &&
        std::string(info.dli_fname).find("libcudart") != std::string::npos)
      setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", info.dli_fname, 0);
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* e = dlerror();
      r.why = std::string("libcudnn.so.9 not found (") + (e ? e : "dlopen failed") +
              "); install cuDNN 9 or put its lib folder on LD_LIBRARY_PATH";
      return r;
    }
    using GetVersion = size_t (*)();
    auto version = reinterpret_cast<GetVersion>(dlsym(h, "cudnnGetVersion"));
    if (version == nullptr) {
      r.why = "libcudnn.so.9 has no cudnnGetVersion";
      return r;
    }
    if (version() < 90000) {
      r.why = "libcudnn reports version " + std::to_string(version()) + "; cuDNN 9 is needed";
      return r;
    }
    cudnn_frontend::cudnn_dlhandle = h;
    r.ok = true;
#endif
    return r;
  }();
  return l;
}

#if LLMPI_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct Shape {
  bool backward;
  int B, T, NH, NKV, hs;
  bool causal;
  bool operator<(const Shape& o) const {
    return std::tie(backward, B, T, NH, NKV, hs, causal) < std::tie(o.backward, o.B, o.T, o.NH, o.NKV, o.hs, o.causal);
  }
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN has no plan for the shape
  int64_t workspace = 0;
};

cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    const cudnnStatus_t s = fe::detail::create_handle(&x);
    if (s != CUDNN_STATUS_SUCCESS) fail("cudnnCreate: ", fe::detail::get_error_string(s));
    return x;
  }();
  return h;
}

std::shared_ptr<fe::graph::Tensor_attributes> strided(fe::graph::Graph& g, const char* name, int64_t uid, int B,
                                                      int heads, int T, int hs, int64_t ld) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, heads, T, hs})
                      .set_stride({T * ld, hs, ld, 1}));
}

void set_strided(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int B, int heads, int T,
                 int hs, int64_t ld) {
  t->set_output(true).set_uid(uid).set_dim({B, heads, T, hs}).set_stride({T * ld, hs, ld, 1});
}

// The graph of one shape, built and planned (heuristics mode A), or the reason it cannot be.
Plan build(const Shape& s, std::string* why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t W = static_cast<int64_t>(s.NH + 2 * s.NKV) * s.hs, C = static_cast<int64_t>(s.NH) * s.hs;
  auto Q = strided(*g, "Q", kQ, s.B, s.NH, s.T, s.hs, W);
  auto K = strided(*g, "K", kK, s.B, s.NKV, s.T, s.hs, W);
  auto V = strided(*g, "V", kV, s.B, s.NKV, s.T, s.hs, W);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  if (!s.backward) {
    auto opt = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale);
    if (s.causal) opt.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [O, Stats] = g->sdpa(Q, K, V, opt);
    set_strided(O, kO, s.B, s.NH, s.T, s.hs, C);
    Stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.B, s.NH, s.T, 1})
        .set_stride({static_cast<int64_t>(s.NH) * s.T, s.T, 1, 1});  // lse [B, NH, T]
  } else {
    auto O = strided(*g, "O", kO, s.B, s.NH, s.T, s.hs, C);
    auto dO = strided(*g, "dO", kdO, s.B, s.NH, s.T, s.hs, C);
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim({s.B, s.NH, s.T, 1})
                               .set_stride({static_cast<int64_t>(s.NH) * s.T, s.T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("sdpa_backward")
                   .set_attn_scale(scale)
                   .set_deterministic_algorithm(true);
    if (s.causal) opt.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
    set_strided(dQ, kdQ, s.B, s.NH, s.T, s.hs, W);
    set_strided(dK, kdK, s.B, s.NKV, s.T, s.hs, W);
    set_strided(dV, kdV, s.B, s.NKV, s.T, s.hs, W);
  }
  Plan p;
  auto step = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    *why = std::string(what) + ": " + e.get_message();
    return false;
  };
  if (!step(g->validate(), "validate") || !step(g->build_operation_graph(handle()), "build_operation_graph") ||
      !step(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
      !step(g->check_support(handle()), "check_support") || !step(g->build_plans(handle()), "build_plans") ||
      !step(g->get_workspace_size(p.workspace), "get_workspace_size"))
    return p;
  p.graph = g;
  return p;
}

const Plan& plan(const Shape& s) {
  static std::map<Shape, Plan> plans;
  auto it = plans.find(s);
  if (it != plans.end()) return it->second;
  std::string why;
  Plan p;
  try {
    p = build(s, &why);
  } catch (const std::exception& e) {
    p = Plan{};
    why = e.what();
  }
  if (!p.graph)
    std::fprintf(stderr,
                 "llmpi: cuDNN attention has no plan for %s B=%d T=%d NH=%d NKV=%d hs=%d%s (%s); "
                 "running our fused-attention kernels for it\n",
                 s.backward ? "backward" : "forward", s.B, s.T, s.NH, s.NKV, s.hs, s.causal ? " causal" : "",
                 why.c_str());
  return plans.emplace(s, std::move(p)).first->second;
}

// The scratch of one call, carved out of the kWsCudnn slot: bf16 qkv, O, dO, dqkv and cuDNN's
// workspace.
struct Scratch {
  uint16_t *qkv16 = nullptr, *o16 = nullptr, *do16 = nullptr, *dqkv16 = nullptr;  // bf16 bits
  void* ws = nullptr;
};

Scratch scratch(const Shape& s, int64_t ws_bytes) {
  const size_t N = static_cast<size_t>(s.B) * s.T, W = static_cast<size_t>(s.NH + 2 * s.NKV) * s.hs,
               C = static_cast<size_t>(s.NH) * s.hs;
  const size_t sizes[] = {aligned(N * W * 2),
                          aligned(N * C * 2),
                          s.backward ? aligned(N * C * 2) : 0,
                          s.backward ? aligned(N * W * 2) : 0,
                          aligned(static_cast<size_t>(ws_bytes))};
  size_t total = 0;
  for (size_t b : sizes) total += b;
  char* p = static_cast<char*>(workspace(kWsCudnn, total));
  Scratch r;
  void** slots[] = {reinterpret_cast<void**>(&r.qkv16), reinterpret_cast<void**>(&r.o16),
                    reinterpret_cast<void**>(&r.do16),  reinterpret_cast<void**>(&r.dqkv16),
                    &r.ws};
  for (int k = 0; k < 5; k++) {
    *slots[k] = sizes[k] ? p : nullptr;
    p += sizes[k];
  }
  return r;
}

void execute(const Plan& p, std::unordered_map<int64_t, void*>& pack, void* ws, const char* what) {
  const cudnnStatus_t st = fe::detail::set_stream(handle(), compute_stream());
  if (st != CUDNN_STATUS_SUCCESS) fail(what, ": cudnnSetStream: ", fe::detail::get_error_string(st));
  fe::error_t e = p.graph->execute(handle(), pack, ws);
  if (e.is_bad())
    fail(what, ": cuDNN's execute failed: ", e.get_message(), " (LLMPI_CUDA_OFF=cudnn_attention runs our kernels)");
  LLMPI_LAUNCH_CHECK(what);
}
#endif  // LLMPI_HAVE_CUDNN_FRONTEND

}  // namespace

bool cudnn_attention_loadable(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok;
}

bool cudnn_attention_applies(GemmPrecision prec, int NH, int NKV, int hs, float dropout_p) {
  return prec == GemmPrecision::bf16 && dropout_p == 0.0f && hs % 8 == 0 && hs <= 128 && NKV > 0 &&
         NH % NKV == 0 && path_on(Path::cudnn_attention) && loaded().ok;
}

#if LLMPI_HAVE_CUDNN_FRONTEND
bool cudnn_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int hs,
                             bool causal) {
  const Shape s{false, B, T, NH, NKV, hs, causal};
  const Plan& p = plan(s);
  if (!p.graph) return false;
  const Scratch x = scratch(s, p.workspace);
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs;
  to_bf16_values(x.qkv16, qkv, static_cast<size_t>(B) * T * W);
  const size_t kv_off = static_cast<size_t>(NH) * hs, v_off = static_cast<size_t>(NH + NKV) * hs;
  std::unordered_map<int64_t, void*> pack = {{kQ, x.qkv16}, {kK, x.qkv16 + kv_off}, {kV, x.qkv16 + v_off},
                                             {kO, x.o16},   {kStats, lse}};
  execute(p, pack, x.ws, "flash_attention_forward (cuDNN)");
  from_bf16_values(out, x.o16, static_cast<size_t>(B) * T * NH * hs, false);  // out = O widened
  return true;
}

bool cudnn_attention_backward(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv,
                              int B, int T, int NH, int NKV, int hs, bool causal) {
  const Shape s{true, B, T, NH, NKV, hs, causal};
  const Plan& p = plan(s);
  if (!p.graph) return false;
  const Scratch x = scratch(s, p.workspace);
  const size_t N = static_cast<size_t>(B) * T, C = static_cast<size_t>(NH) * hs,
               W = static_cast<size_t>(NH + 2 * NKV) * hs;
  to_bf16_values(x.qkv16, qkv, N * W);
  to_bf16_values(x.o16, out, N * C);
  to_bf16_values(x.do16, dout, N * C);
  const size_t kv_off = static_cast<size_t>(NH) * hs, v_off = static_cast<size_t>(NH + NKV) * hs;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, x.qkv16},         {kK, x.qkv16 + kv_off},  {kV, x.qkv16 + v_off},  {kO, x.o16},
      {kdO, x.do16},         {kStats, const_cast<float*>(lse)}, {kdQ, x.dqkv16}, {kdK, x.dqkv16 + kv_off},
      {kdV, x.dqkv16 + v_off}};
  execute(p, pack, x.ws, "flash_attention_backward (cuDNN)");
  from_bf16_values(dqkv, x.dqkv16, N * W, true);  // dqkv += widened dQ, dK, dV (both [B, T, W])
  return true;
}
#else
bool cudnn_attention_forward(float*, float*, const float*, int, int, int, int, int, bool) { return false; }
bool cudnn_attention_backward(float*, const float*, const float*, const float*, const float*, int, int, int, int, int,
                              bool) {
  return false;
}
#endif

}  // namespace llmpi::cuda
