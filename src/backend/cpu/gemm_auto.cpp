// "auto" of the CPU's GEMM engines: the choice from times, the timing, OpenBLAS's kernels (the
// contract: backend/cpu/gemm_auto.h).
#include "backend/cpu/gemm_auto.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <unistd.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/onednn_gemm.h"

namespace llmpi::cpu {

namespace {

bool timed(double s) { return s > 0 && std::isfinite(s); }

double block_flops(const DenseShape& s) { return 6.0 * s.rows * s.in * s.out; }

// Deterministic operand values in [-1/16, 1/16): no zeros, infinities or denormals.
void fill(std::vector<float>& v, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.125f;
  }
}

// One timed block's operands, results and gradients (fp32, and the weight's bf16 copy).
struct Buffers {
  DenseShape s;
  std::vector<float> inp, w, out, dout, dinp, dw;
  std::vector<uint16_t> w16;
  explicit Buffers(const DenseShape& b)
      : s(b),
        inp(static_cast<size_t>(b.rows) * b.in),
        w(static_cast<size_t>(b.out) * b.in),
        out(static_cast<size_t>(b.rows) * b.out),
        dout(out.size()),
        dinp(inp.size()),
        dw(w.size()),
        w16(w.size()) {
    fill(inp, 1), fill(w, 2), fill(dout, 3);
    store_bf16_bits(w16.data(), w.data(), w.size());
  }
};

// Seconds of the block's forward and backward on the engine selected now.
double run_block(Buffers& b, GemmPrecision prec) {
  const GemmMode g(prec, prec == GemmPrecision::bf16 ? b.w16.data() : nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  matmul_forward(b.out.data(), b.inp.data(), b.w.data(), nullptr, b.s.rows, b.s.in, b.s.out, g);
  matmul_backward(b.dinp.data(), b.dw.data(), nullptr, b.dout.data(), b.inp.data(), b.w.data(), b.s.rows, b.s.in,
                  b.s.out, g);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs every block on `engine`; keeps each block's fastest in best.
template <typename Engine>
void run_pass_on(std::vector<Buffers>& blocks, GemmPrecision prec, Engine engine, std::vector<double>& best) {
  const ScopedCpuGemm<Engine> selected(engine);
  for (size_t i = 0; i < blocks.size(); i++) best[i] = std::min(best[i], run_block(blocks[i], prec));
}

// Runs every block on engine e (0 the fallback, 1 oneDNN); keeps each block's fastest in best.
void run_pass(std::vector<Buffers>& blocks, GemmPrecision prec, int e, std::vector<double>& best) {
  const bool dnn = e == 1;
  if (prec == GemmPrecision::bf16)
    run_pass_on(blocks, prec, dnn ? CpuBf16Gemm::onednn : CpuBf16Gemm::emulate, best);
  else
    run_pass_on(blocks, prec, dnn ? CpuFp32Gemm::onednn : CpuFp32Gemm::openblas, best);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

bool auto_prefers_onednn(const CpuGemmTimes& t) {
  return timed(t.onednn_s) && timed(t.fallback_s) && t.onednn_s <= kAutoOnednnShare * t.fallback_s;
}
CpuFp32Gemm cpu_fp32_gemm_from_times(const CpuGemmTimes& t) {
  return auto_prefers_onednn(t) ? CpuFp32Gemm::onednn : CpuFp32Gemm::openblas;
}
CpuBf16Gemm cpu_bf16_gemm_from_times(const CpuGemmTimes& t) {
  return auto_prefers_onednn(t) ? CpuBf16Gemm::onednn : CpuBf16Gemm::emulate;
}

double dense_step_flops(const std::vector<DenseShape>& layers) {
  double f = 0;
  for (const DenseShape& s : layers) f += block_flops(s) * s.count;
  return f;
}

std::vector<TimedBlock> timed_blocks(const std::vector<DenseShape>& layers, int threads) {
  std::vector<TimedBlock> blocks;
  for (const DenseShape& s : layers) {
    if (s.rows <= 0 || s.in <= 0 || s.out <= 0 || s.count <= 0) continue;
    auto same = [&](const TimedBlock& b) {
      return b.shape.rows == s.rows && b.shape.in == s.in && b.shape.out == s.out;
    };
    auto it = std::find_if(blocks.begin(), blocks.end(), same);
    if (it != blocks.end()) it->shape.count += s.count;
    else blocks.push_back({s, s});
  }
  if (blocks.empty()) return blocks;
  const double budget = kTimedFlopsPerThread * std::max(1, threads) / static_cast<double>(blocks.size());
  for (TimedBlock& t : blocks) {
    DenseShape& b = t.block;
    b.count = 1;
    b.rows = std::min(b.rows, kTimedRows);
    while (block_flops(b) > budget) {  // rows first, then the larger of in and out
      int* edge = b.rows > kTimedMinEdge ? &b.rows : b.in >= b.out ? &b.in : &b.out;
      if (*edge <= kTimedMinEdge) break;
      *edge = std::max(kTimedMinEdge, (*edge + 1) / 2);
    }
  }
  return blocks;
}

CpuGemmTimes time_dense_layers(GemmPrecision prec, const std::vector<DenseShape>& layers) {
  CpuGemmTimes t;
  if (prec == GemmPrecision::tf32) return t;
  const bool bf16 = prec == GemmPrecision::bf16;
  if (!(bf16 ? onednn_bf16_available() : onednn_fp32_available())) return t;
  if (dense_step_flops(layers) < kAutoMinStepFlops) return t;
  const std::vector<TimedBlock> plan = timed_blocks(layers, openblas_get_num_threads());
  std::vector<Buffers> blocks;
  for (const TimedBlock& b : plan) blocks.emplace_back(b.block);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> warm(blocks.size(), inf), best[2] = {warm, warm};
  const auto t0 = std::chrono::steady_clock::now();
  for (int e = 0; e < 2; e++) run_pass(blocks, prec, e, warm);  // primitives made, pages touched
  for (int p = 0; p < kTimedPasses; p++) {
    for (int k = 0; k < 2; k++) {
      const int e = (p + k) % 2;  // alternating which engine goes first
      run_pass(blocks, prec, e, best[e]);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > kTimedMaxSeconds) break;
  }
  double sums[2] = {0, 0};
  for (int e = 0; e < 2; e++)
    for (size_t i = 0; i < plan.size(); i++)
      sums[e] += best[e][i] * block_flops(plan[i].shape) / block_flops(plan[i].block) * plan[i].shape.count;
  t.fallback_s = sums[0];
  t.onednn_s = sums[1];
  return t;
}

std::string describe_gemm_times(GemmPrecision prec, const CpuGemmTimes& t) {
  const std::string core = std::string("OpenBLAS core ") + openblas_get_corename();
  if (!timed(t.onednn_s) || !timed(t.fallback_s))
    return "not timed: under " + std::to_string(static_cast<int>(kAutoMinStepFlops / 1e6)) +
           " MFLOP of dense-layer GEMMs per step, too little to tell the engines apart (" + core + ")";
  char buf[256];
  const char* fallback = prec == GemmPrecision::bf16 ? "emulate" : "openblas";
  std::snprintf(buf, sizeof buf,
                "timed this run's GEMMs: onednn %.3g ms, %s %.3g ms per step (oneDNN is kept at <= %.0f%% of %s's; %s)",
                t.onednn_s * 1e3, fallback, t.fallback_s * 1e3, kAutoOnednnShare * 100, fallback, core.c_str());
  return buf;
}

int openblas_core_level(const std::string& core) {
  static const char* const levels[4][18] = {
      {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "nano", "opteron", "opteron_sse3", "barcelona",
       "bobcat", "katmai", "coppermine", "northwood", "banias", "athlon", "unknown", "generic"},
      {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"},
      {"haswell", "zen"},
      {"skylakex", "cooperlake", "sapphirerapids"}};
  const std::string name = lower(core);
  for (int level = 0; level < 4; level++)
    for (const char* n : levels[level])
      if (n != nullptr && name == n) return level;
  return -1;
}

int cpu_vector_level() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  return __builtin_cpu_supports("avx") ? 1 : 0;
}

namespace {
const char* const kIsaName[4] = {"SSE", "AVX", "AVX2", "AVX-512"};
const char* const kFittingCore[4] = {"", "Sandybridge", "Haswell", "SkylakeX"};
// Whether this OpenBLAS picks its kernels at run time (DYNAMIC_ARCH).
bool openblas_dynamic() {
  const char* config = openblas_get_config();
  return config != nullptr && std::strstr(config, "DYNAMIC_ARCH") != nullptr;
}
}  // namespace

std::string openblas_fitting_core(const std::string& core, int cpu_level, bool dynamic) {
  const int level = openblas_core_level(core);
  if (!dynamic || level < 0 || cpu_level < 0 || cpu_level > 3 || cpu_level - level < 2) return "";
  return kFittingCore[cpu_level];
}

std::string openblas_core_warning(const std::string& core, int cpu_level, bool dynamic) {
  const int level = openblas_core_level(core);
  if (level < 0 || cpu_level - level < 2) return "";
  std::string w = std::string("OpenBLAS runs its ") + core + " kernels (" + kIsaName[level] + ") on this CPU, which has " +
                  kIsaName[cpu_level] + ": its GEMMs (attention's, and the dense layers' on OpenBLAS) run several times "
                  "slower than they could; ";
  if (!dynamic)
    return w + "this OpenBLAS was built for one CPU type (no DYNAMIC_ARCH), so OPENBLAS_CORETYPE cannot change it: use "
               "one built for this CPU (Debian's libopenblas0-pthread picks its kernels at run time)";
  return w + "set OPENBLAS_CORETYPE=" + kFittingCore[cpu_level] + " in every rank's environment (export it before mpiexec)";
}

std::string openblas_core_warning() {
  return openblas_core_warning(openblas_get_corename(), cpu_vector_level(), openblas_dynamic());
}

void exec_with_fitting_openblas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or already set here
  const std::string picked = openblas_get_corename();
  const std::string fit = openblas_fitting_core(picked, cpu_vector_level(), openblas_dynamic());
  if (fit.empty()) return;
  if (setenv("OPENBLAS_CORETYPE", fit.c_str(), 1) != 0 || setenv("LLMPI_OPENBLAS_CORE_FROM", picked.c_str(), 1) != 0)
    return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on with the kernels loaded, warned about at start-up
  unsetenv("LLMPI_OPENBLAS_CORE_FROM");
}

std::string openblas_kernels_note() {
  const char* from = std::getenv("LLMPI_OPENBLAS_CORE_FROM");
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (from == nullptr || set == nullptr) return "";
  const int level = openblas_core_level(from);
  return std::string("OpenBLAS kernels: ") + openblas_get_corename() + ", set by llmpi-train (OpenBLAS picked its " +
         from + " kernels (" + (level >= 0 ? kIsaName[level] : "older") + ") on this " +
         kIsaName[std::clamp(cpu_vector_level(), 0, 3)] +
         " CPU, which it does not recognise; export OPENBLAS_CORETYPE before mpiexec to choose them yourself)";
}

}  // namespace llmpi::cpu
