// The run-time switches of the CUDA backend's paths (backend/cuda_ops.h "Paths"; the table in
// docs/GPU.md "Switches"). Each entry is a kernel change whose speed on a card has not been timed on
// its own, and what runs instead when it is switched off: the earlier version, still built beside
// it. LLMPI_CUDA_OFF=name,name,... (or "all") in the environment switches paths off, read
// once, at the first query; an unknown name is an Error naming the known ones. When a card has
// shown a path correct and faster, the change that records the figure deletes its entry and the
// old code together.
//
// Host code only (no kernels): the CPU simulator (tools/cuda_cpu_sim) compiles it unchanged.
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

struct PathEntry {
  Path path;
  const char* name;
  const char* change;    // what the unverified path does (and its commit)
  const char* fallback;  // what runs when it is off
};

// In the order of enum Path.
const PathEntry kPaths[] = {
    {Path::mma_attention, "mma_attention",
     "bf16 fused attention on mma.sync, scores and accumulators in registers (f9859c8)",
     "the WMMA kernels verified on an H100 (flash_attention_wmma.cu)"},
    {Path::tf32_attention, "tf32_attention", "tf32 fused attention on the tensor-core kernels (1d505dc)",
     "the fp32 CUDA-core kernels, as verified"},
    {Path::attention_tile_order, "attention_tile_order",
     "fused attention's forward and dQ blocks take the last query tiles first (20c6f6b)", "the first tiles first"},
    {Path::rowdot_warp, "rowdot_warp", "fused attention's D = dO . out a warp per (row, head) (62df8c3)",
     "a thread per (row, head)"},
    {Path::softmax_row_smem, "softmax_row_smem", "softmax + cross-entropy keeps the row in shared memory (e5b96d1)",
     "the two-pass kernel"},
    {Path::colsum_in_conversion, "colsum_in_conversion",
     "bf16 backward: the bias gradient summed in the pass converting dout (13f5f7b)",
     "the conversion, then the column sums (the same bits)"},
    {Path::gelu_grad_vec4, "gelu_grad_vec4", "bf16 dGELU's elementwise part with 16-byte accesses (c2c04e8)",
     "one float per access (the same bits)"},
    {Path::bf16_gelu_kernel, "bf16_gelu_kernel",
     "bf16 GPT-2 GELU: the GEMM's BIAS epilogue, then our kernel writing act in bf16 (190d176)",
     "cuBLASLt's GELU_AUX_BIAS epilogue into fp32, then the bf16 conversion"},
    {Path::partial_sums_lanes, "partial_sums_lanes",
     "column sums' second pass on 16 lanes of chunks per column (2df35d4)",
     "a thread per column, the chunks in order"},
    {Path::cudnn_attention, "cudnn_attention",
     "bf16 fused attention through cuDNN's SDPA graphs where dropout is 0 (cudnn_attention.cpp)",
     "our fused-attention kernels"},
    {Path::adamw_vec4, "adamw_vec4",
     "AdamW's segment update moves parameters, gradients and moments with 16-byte accesses (adamw.cu)",
     "one float per access (the same bits)"},
};
static_assert(sizeof(kPaths) / sizeof(kPaths[0]) == static_cast<size_t>(Path::count), "one entry per Path");

struct PathState {
  bool off[static_cast<int>(Path::count)] = {};
  std::string off_list;  // as given (LLMPI_CUDA_OFF or set_paths_off)
};

std::mutex g_paths_mutex;
PathState* g_paths = nullptr;

PathState parse_off_list(const std::string& list, const char* where) {
  PathState st;
  st.off_list = list;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(pos, end - pos);
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    while (!name.empty() && name.back() == ' ') name.pop_back();
    if (name == "all") {
      for (bool& b : st.off) b = true;
    } else if (!name.empty()) {
      bool found = false;
      for (const PathEntry& e : kPaths)
        if (name == e.name) st.off[static_cast<int>(e.path)] = found = true;
      if (!found) {
        std::string known;
        for (const PathEntry& e : kPaths) known += std::string(known.empty() ? "" : ", ") + e.name;
        fail(where, ": unknown path '", name, "'; the paths that can be switched off are: all, ", known);
      }
    }
    pos = end + 1;
  }
  return st;
}

const PathState& state() {
  std::lock_guard<std::mutex> lock(g_paths_mutex);
  if (g_paths == nullptr) {
    const char* v = std::getenv("LLMPI_CUDA_OFF");
    g_paths = new PathState(parse_off_list(v ? v : "", "LLMPI_CUDA_OFF"));
  }
  return *g_paths;
}

}  // namespace

bool path_on(Path p) { return !state().off[static_cast<int>(p)]; }

std::string set_paths_off(const std::string& list) {
  PathState st = parse_off_list(list, "cuda_set_paths_off");
  const std::string before = state().off_list;
  std::lock_guard<std::mutex> lock(g_paths_mutex);
  *g_paths = st;
  return before;
}

}  // namespace llmpi::cuda

namespace llmpi {

std::vector<CudaPath> cuda_paths() {
  std::vector<CudaPath> out;
  for (const cuda::PathEntry& e : cuda::kPaths) {
    CudaPath p;
    p.name = e.name;
    p.change = e.change;
    p.fallback = e.fallback;
    p.on = cuda::path_on(e.path);
    if (!p.on) p.why_off = "switched off: LLMPI_CUDA_OFF=" + cuda::state().off_list;
    if (p.on && e.path == cuda::Path::cudnn_attention) {
      std::string why;
      if (!cuda::cudnn_attention_loadable(&why)) {
        p.on = false;
        p.why_off = why;
      }
    }
    out.push_back(p);
  }
  return out;
}

std::string cuda_paths_description() {
  std::string on, off;
  for (const CudaPath& p : cuda_paths()) {
    if (p.on)
      on += (on.empty() ? "" : " ") + p.name;
    else
      off += (off.empty() ? "" : "; ") + p.name + " (" + p.why_off + ")";
  }
  return "unverified CUDA paths on: " + (on.empty() ? std::string("none") : on) +
         "; off: " + (off.empty() ? std::string("none") : off) + " (LLMPI_CUDA_OFF=all runs the verified set)";
}

bool cuda_path_enabled(const std::string& name) {
  for (const CudaPath& p : cuda_paths())
    if (p.name == name) return p.on;
  fail("cuda_path_enabled: unknown path '", name, "'");
}

std::string cuda_set_paths_off(const std::string& list) { return cuda::set_paths_off(list); }

}  // namespace llmpi
