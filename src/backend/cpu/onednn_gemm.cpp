// The CPU GEMM engine selections and oneDNN's matmul (the contract: backend/cpu/onednn_gemm.h).
//
// oneDNN (the OpenMP build Debian ships) sizes its parallel work by omp_get_max_threads() when a
// primitive is made and runs it on that many threads, so both happen with OpenMP's count set to the
// caller's `threads` and restored afterwards. A primitive is made once per GemmKey and kept (making
// one, which chooses and JIT-compiles the kernels, costs ~0.3 ms, as much as a small GEMM); the
// scratchpad is passed by the caller (scratchpad_mode::user) from a per-thread buffer, so no call
// allocates (with the library's own scratchpad this build would allocate and fault in fresh pages
// on every call).
#include "backend/cpu/onednn_gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "runtime/error.h"

#if LLMPI_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace llmpi::cpu {

namespace {

// One selection: the engine in use and why (the key as given, or why oneDNN cannot run).
template <typename Engine>
struct Selection {
  std::atomic<Engine> engine;
  std::string reason;  // guarded by reason_mutex
};
std::mutex reason_mutex;
Selection<CpuBf16Gemm> bf16_selection{{CpuBf16Gemm::emulate}, "the default until runtime.cpu_bf16_gemm is selected"};
Selection<CpuFp32Gemm> fp32_selection{{CpuFp32Gemm::openblas}, "the default until runtime.cpu_fp32_gemm is selected"};

#if LLMPI_HAVE_ONEDNN

// One GEMM shape as oneDNN sees it: everything a primitive depends on.
struct GemmKey {
  bool bf16, trans_a, trans_b;
  int M, N, K, lda, ldb, ldc;
  bool accumulate;  // beta = 1
  bool bias;
  int threads;
  auto tie() const { return std::tie(bf16, trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, bias, threads); }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPlan {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, bias, c, scratchpad;
  std::string impl;  // oneDNN's name of the implementation, e.g. "brg:avx512_core_bf16"
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// OpenMP's thread count set to `threads` for the lifetime of the object (this thread's setting).
struct OmpThreads {
  int saved;
  explicit OmpThreads(int threads) : saved(omp_get_max_threads()) {
    if (threads != saved) omp_set_num_threads(threads);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != saved) omp_set_num_threads(saved);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;
};

GemmPlan make_plan(const GemmKey& k) {
  using dnnl::memory;
  const memory::data_type t = k.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  // Row-major with leading dimensions; a transposed operand is the same matrix read by columns.
  const memory::desc a({k.M, k.K}, t, k.trans_a ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
  const memory::desc b({k.K, k.N}, t, k.trans_b ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
  const memory::desc c({k.M, k.N}, memory::data_type::f32, memory::dims{k.ldc, 1});
  const memory::desc bias =
      k.bias ? memory::desc({1, k.N}, memory::data_type::f32, memory::dims{k.N, 1}) : memory::desc();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(k.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c), attr,
                                        cpu_engine());
  return {dnnl::matmul(pd), a, b, bias, c, pd.scratchpad_desc(), pd.impl_info_str()};
}

// Primitives made so far. A process sees a handful of shapes per model (the last chunk of the LM
// head's rows adds one); the bound only keeps a pathological caller from growing it forever.
constexpr size_t kMaxPlans = 1024;
std::mutex plans_mutex;
std::map<GemmKey, std::shared_ptr<const GemmPlan>> plans;

std::shared_ptr<const GemmPlan> plan_for(const GemmKey& k) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  auto it = plans.find(k);
  if (it != plans.end()) return it->second;
  if (plans.size() >= kMaxPlans) plans.clear();  // (callers holding one keep it alive)
  auto plan = std::make_shared<const GemmPlan>(make_plan(k));
  plans.emplace(k, plan);
  return plan;
}

// This thread's scratchpad, 64-byte aligned, grown on demand and never shrunk.
void* thread_scratchpad(size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buf;
  if (bytes > buf.size) {
    std::free(buf.p);
    buf.size = (bytes + 4095) / 4096 * 4096;
    buf.p = std::aligned_alloc(64, buf.size);
    if (buf.p == nullptr) fail("out of memory for a ", buf.size, "-byte oneDNN scratchpad");
  }
  return buf.p;
}

void check_layout(const GemmKey& k) {
  const bool ok = k.M >= 0 && k.N >= 0 && k.K >= 0 && k.lda >= std::max(1, k.trans_a ? k.M : k.K) &&
                  k.ldb >= std::max(1, k.trans_b ? k.K : k.N) && k.ldc >= std::max(1, k.N) && k.threads >= 1;
  if (!ok)
    fail("internal: oneDNN GEMM with M ", k.M, ", N ", k.N, ", K ", k.K, ", lda ", k.lda, ", ldb ", k.ldb, ", ldc ",
         k.ldc, ", threads ", k.threads);
}

void run_gemm(const GemmKey& k, float beta, const void* A, const void* B, float* C, const float* bias) {
  if (beta != 0.0f && beta != 1.0f) fail("internal: oneDNN GEMM with beta ", beta, " (0 or 1 only)");
  check_layout(k);
  if (k.M == 0 || k.N == 0) return;
  if (k.K == 0) {  // an empty sum: C = bias + beta C
    for (int m = 0; m < k.M; m++)
      for (int n = 0; n < k.N; n++) {
        float& c = C[static_cast<size_t>(m) * k.ldc + n];
        c = (bias ? bias[n] : 0.0f) + (k.accumulate ? c : 0.0f);
      }
    return;
  }
  try {
    OmpThreads omp_threads(k.threads);
    const std::shared_ptr<const GemmPlan> plan = plan_for(k);
    dnnl::engine& engine = cpu_engine();
    thread_local dnnl::stream stream(engine);
    dnnl::memory a(plan->a, engine, const_cast<void*>(A)), b(plan->b, engine, const_cast<void*>(B)),
        c(plan->c, engine, C), scratchpad(plan->scratchpad, engine, thread_scratchpad(plan->scratchpad.get_size()));
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, scratchpad}};
    if (k.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(plan->bias, engine, const_cast<float*>(bias)));
    plan->primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    fail("oneDNN's ", k.bf16 ? "bf16" : "fp32", " matmul (", k.M, " x ", k.N, " x ", k.K, ") failed: ", e.what(),
         k.bf16 ? "; use runtime.cpu_bf16_gemm \"emulate\"" : "; use runtime.cpu_fp32_gemm \"openblas\"");
  }
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

#endif  // LLMPI_HAVE_ONEDNN

// "" when oneDNN's bf16 (bf16 true) or fp32 matmul can run here, else why not (computed once each).
std::string onednn_unavailable_reason(bool bf16) {
#if LLMPI_HAVE_ONEDNN
  const char* type = bf16 ? "bf16" : "fp32";
  try {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    const unsigned with_bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    if (bf16 && (static_cast<unsigned>(isa) & with_bf16) != with_bf16)
      return std::string("oneDNN finds no bf16 instructions on this CPU (its ISA here: ") + isa_name(isa) + ")";
    const std::string impl = onednn_matmul_impl(bf16, false, true, 64, 64, 64);
    if (impl.find("ref") != std::string::npos)
      return std::string("oneDNN has only its reference ") + type + " matmul on this CPU (" + impl + ")";
    return "";
  } catch (const std::exception& e) {
    return std::string("oneDNN could not make a ") + type + " matmul: " + e.what();
  }
#else
  (void)bf16;
  return "this build has no oneDNN (install libdnnl-dev, e.g. with `make deps`, and rebuild)";
#endif
}

bool onednn_available(bool bf16, std::string* why) {
  static const std::string reasons[2] = {onednn_unavailable_reason(false), onednn_unavailable_reason(true)};
  const std::string& reason = reasons[bf16];
  if (why) *why = reason;
  return reason.empty();
}

// Selects `want` into `sel`: oneDNN when asked for (refused with `key`'s fix where it cannot run)
// or when automatic, it can run and auto_onednn says so (untimed "auto": bf16 yes, fp32 no), else
// `fallback`. why: the banner's reason when not empty, else the key as given (and for "auto"
// where oneDNN cannot run, why not).
template <typename Engine>
void select_engine(Selection<Engine>& sel, Engine want, bool bf16, const char* key, Engine fallback, bool auto_onednn,
                   const std::string& why) {
  std::string missing;
  const bool have = onednn_available(bf16, &missing);
  if (want == Engine::onednn && !have)
    fail(key, " \"onednn\": ", missing, "; use \"auto\" or \"", option_name(fallback), "\"");
  const bool onednn = want == Engine::onednn || (want == Engine::automatic && have && auto_onednn);
  std::lock_guard<std::mutex> lock(reason_mutex);
  sel.engine.store(onednn ? Engine::onednn : fallback);
  const std::string given = std::string(key) + " \"" + option_name(want) + "\"";
  sel.reason = !why.empty() ? why : want != Engine::automatic ? given : !have ? missing : given + ", not timed";
}

// "oneDNN 2.6.3 <type> matmul (<implementation>; <reason>)"
std::string onednn_description(bool bf16, const std::string& reason) {
#if LLMPI_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl::version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         (bf16 ? " bf16" : " fp32") + " matmul (" + onednn_matmul_impl(bf16, false, true, 64, 64, 64) + "; " +
         reason + ")";
#else
  (void)bf16, (void)reason;
  return "";  // (unreachable: onednn is never selected without it)
#endif
}

}  // namespace

bool onednn_bf16_available(std::string* why) { return onednn_available(true, why); }
bool onednn_fp32_available(std::string* why) { return onednn_available(false, why); }

void select_cpu_bf16_gemm(CpuBf16Gemm want, const std::string& why) {
  select_engine(bf16_selection, want, true, "runtime.cpu_bf16_gemm", CpuBf16Gemm::emulate, true, why);
}
void select_cpu_fp32_gemm(CpuFp32Gemm want, const std::string& why) {
  select_engine(fp32_selection, want, false, "runtime.cpu_fp32_gemm", CpuFp32Gemm::openblas, false, why);
}

CpuFp32Gemm cpu_fp32_gemm_for_auto() { return CpuFp32Gemm::openblas; }

CpuBf16Gemm cpu_bf16_gemm() { return bf16_selection.engine.load(); }
CpuFp32Gemm cpu_fp32_gemm() { return fp32_selection.engine.load(); }

std::string cpu_bf16_gemm_description() {
  std::lock_guard<std::mutex> lock(reason_mutex);
  if (bf16_selection.engine.load() == CpuBf16Gemm::emulate)
    return "emulated (operands rounded to bf16, fp32 OpenBLAS sgemm): " + bf16_selection.reason;
  return onednn_description(true, bf16_selection.reason);
}

std::string cpu_fp32_gemm_description() {
  std::lock_guard<std::mutex> lock(reason_mutex);
  if (fp32_selection.engine.load() == CpuFp32Gemm::openblas) return "OpenBLAS sgemm: " + fp32_selection.reason;
  return onednn_description(false, fp32_selection.reason);
}

void onednn_bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                      int ldb, float beta, float* C, int ldc, int threads, const float* bias) {
#if LLMPI_HAVE_ONEDNN
  run_gemm({true, trans_a, trans_b, M, N, K, lda, ldb, ldc, beta != 0.0f, bias != nullptr, threads}, beta, A, B, C,
           bias);
#else
  fail("internal: oneDNN GEMM called in a build without oneDNN");
#endif
}

void onednn_f32_gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc, int threads, const float* bias) {
#if LLMPI_HAVE_ONEDNN
  run_gemm({false, trans_a, trans_b, M, N, K, lda, ldb, ldc, beta != 0.0f, bias != nullptr, threads}, beta, A, B, C,
           bias);
#else
  fail("internal: oneDNN GEMM called in a build without oneDNN");
#endif
}

std::string onednn_matmul_impl(bool bf16, bool trans_a, bool trans_b, int M, int N, int K) {
#if LLMPI_HAVE_ONEDNN
  const GemmKey k{bf16, trans_a, trans_b, M, N, K, trans_a ? M : K, trans_b ? K : N, N,
                  false, false, omp_get_max_threads()};
  return plan_for(k)->impl;
#else
  return "";
#endif
}

}  // namespace llmpi::cpu
