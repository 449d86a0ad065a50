// bench-sgemm_rate: the single-thread OpenBLAS cblas_sgemm rate on the GEMM shapes of the
// reference model, the ceiling that CPU training throughput is compared against; with --gemm,
// oneDNN's fp32 matmul on the same fp32 operands, or its bf16 matmul on bf16 operands (fp32
// accumulation and output: the ceiling of runtime.precision bf16 on oneDNN, backend/cpu/onednn_gemm.h).
//
//   mpiexec -n 2 build/bench-sgemm_rate [--json OUT] [--seconds S] [--rows N] [--d-model C]
//                                        [--vocab V] [--n-layer L] [--gemm sgemm|onednn-fp32|onednn-bf16]
//
// Every rank runs the same single-threaded GEMMs at the same time (a barrier before each
// timed call), so all cores are busy at once as they are in training. For each linear layer
// y[N,OC] = x[N,IC] W[OC,IC]^T of the model (row-major) it times the three calls of a
// training step:
//   fwd   y  = x W^T        NT  M=N   N=OC  K=IC
//   dx    dx = dy W         NN  M=N   N=IC  K=OC
//   dW    dW += dy^T x      TN  M=OC  N=IC  K=N   (beta = 1: gradients accumulate)
// for qkv (C->3C), attention proj (C->C), MLP fc (C->F, or C->2F for a gated MLP: SwiGLU's
// [gate | up]), MLP proj (F->C) and the lm head (C->V; none with --vocab 0, a classifier model),
// F = --ffn-dim (default 4C). The schedule is round-robin (one call of each shape per round, repeated for about
// --seconds), so noise from other processes spreads over all shapes; each shape's time per
// call is the median over rounds.
//
// The aggregate is FLOP-weighted by the model's mix: total FLOPs of one training step's
// GEMMs (block shapes x n_layer, lm head x 1) divided by their total median time. Rank 0
// reports each shape's median over ranks and the median over ranks of the aggregate
// (gflops_per_rank_median). Attention's T x T score GEMMs are not included.
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cblas.h>
#include <dlfcn.h>

#include "backend/bf16.h"
#include "backend/cpu/gemm_auto.h"
#include "backend/cpu/onednn_gemm.h"

extern "C" {
// OpenBLAS extensions (declared here too in case <cblas.h> is another implementation's).
void openblas_set_num_threads(int num_threads);
char* openblas_get_corename(void);
char* openblas_get_config(void);
int openblas_get_parallel(void);  // 0 sequential, 1 pthreads, 2 OpenMP build
}

namespace {

const char* kProg = "bench-sgemm_rate";

struct Options {
  std::string json;
  double seconds = 2.5;
  int rows = 2048;  // tokens per rank per step: batch 8 x seq_len 256
  int d_model = 256;
  int vocab = 4096;
  int n_layer = 4;
  int ffn_dim = 0;     // MLP hidden size; 0 = 4 * d_model
  bool gated = false;  // SwiGLU: the fc GEMM produces [gate | up], 2 * ffn_dim wide
  std::string gemm = "sgemm";  // "sgemm" | "onednn-fp32" | "onednn-bf16"
};

struct Shape {
  std::string name;   // "qkv fwd"
  const char* op;     // "NT", "NN", "TN"
  int m, n, k;
  int weight;         // how many times one training step runs it
  double flops() const { return 2.0 * m * n * k; }
};

struct Buffers {
  float* a = nullptr;
  float* b = nullptr;
  float* c = nullptr;
  std::vector<uint16_t> a16, b16;  // --gemm onednn-bf16: a and b as bf16 bits
};

float* alloc_floats(size_t count, uint64_t& state) {
  size_t bytes = ((count * sizeof(float) + 63) / 64) * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!p) {
    std::fprintf(stderr, "%s: error: out of memory allocating %zu bytes\n", kProg, bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < count; ++i) {  // values in [-1, 1): no denormals, no overflow
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<int32_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return p;
}

void run_gemm(const std::string& gemm, const Shape& s, const Buffers& buf) {
  const int m = s.m, n = s.n, k = s.k;
  if (gemm != "sgemm") {  // the same three products through oneDNN, on one thread
    const bool ta = std::strcmp(s.op, "TN") == 0, tb = std::strcmp(s.op, "NT") == 0;
    const int lda = ta ? m : k, ldb = tb ? k : n;
    const float beta = ta ? 1.0f : 0.0f;
    if (gemm == "onednn-bf16")
      llmpi::cpu::onednn_bf16_gemm(ta, tb, m, n, k, buf.a16.data(), lda, buf.b16.data(), ldb, beta, buf.c, n, 1);
    else
      llmpi::cpu::onednn_f32_gemm(ta, tb, m, n, k, buf.a, lda, buf.b, ldb, beta, buf.c, n, 1);
    return;
  }
  if (std::strcmp(s.op, "NT") == 0) {
    // C[m,n] = A[m,k] * B[n,k]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, buf.a, k, buf.b, k, 0.0f, buf.c, n);
  } else if (std::strcmp(s.op, "NN") == 0) {
    // C[m,n] = A[m,k] * B[k,n]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, buf.a, k, buf.b, n, 0.0f, buf.c, n);
  } else {
    // C[m,n] += A[k,m]^T * B[k,n]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, buf.a, m, buf.b, n, 1.0f, buf.c, n);
  }
}

std::vector<Shape> model_shapes(const Options& o) {
  struct Linear {
    const char* name;
    int in, out, weight;
  };
  const int C = o.d_model, F = o.ffn_dim > 0 ? o.ffn_dim : 4 * C;
  const Linear linears[] = {{"qkv", C, 3 * C, o.n_layer},
                            {"attn proj", C, C, o.n_layer},
                            {"mlp fc", C, o.gated ? 2 * F : F, o.n_layer},
                            {"mlp proj", F, C, o.n_layer},
                            {"lm head", C, o.vocab, 1}};
  std::vector<Shape> shapes;
  for (const auto& l : linears) {
    if (l.out == 0) continue;  // --vocab 0: no lm head
    const std::string name = l.name;
    shapes.push_back({name + " fwd", "NT", o.rows, l.out, l.in, l.weight});
    shapes.push_back({name + " dx", "NN", o.rows, l.in, l.out, l.weight});
    shapes.push_back({name + " dW", "TN", l.out, l.in, o.rows, l.weight});
  }
  return shapes;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool parse_int(const char* s, int lo, int hi, int& out) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

// Returns "" when the arguments are fine, else the error message; sets help.
std::string parse_args(int argc, char** argv, Options& o, bool& help) {
  help = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help = true;
      return "";
    }
    if (arg == "--gated") {
      o.gated = true;
      continue;
    }
    static const char* known[] = {"--json", "--seconds", "--rows", "--d-model", "--vocab", "--n-layer", "--ffn-dim",
                                  "--gemm"};
    if (std::none_of(std::begin(known), std::end(known), [&](const char* k) { return arg == k; }))
      return "unknown option '" + arg + "'";
    if (i + 1 >= argc) return "option " + arg + " needs a value";
    const char* val = argv[++i];
    if (arg == "--json") {
      o.json = val;
      if (o.json.empty()) return "--json needs a file name";
    } else if (arg == "--seconds") {
      char* end = nullptr;
      o.seconds = std::strtod(val, &end);
      if (end == val || *end != '\0' || !(o.seconds > 0.0 && o.seconds <= 600.0))
        return std::string("--seconds must be a number in (0, 600], got '") + val + "'";
    } else if (arg == "--rows") {
      if (!parse_int(val, 1, 1 << 20, o.rows)) return std::string("--rows must be an integer in [1, 1048576], got '") + val + "'";
    } else if (arg == "--d-model") {
      if (!parse_int(val, 1, 65536, o.d_model)) return std::string("--d-model must be an integer in [1, 65536], got '") + val + "'";
    } else if (arg == "--vocab") {
      if (!parse_int(val, 0, 1 << 20, o.vocab)) return std::string("--vocab must be an integer in [0, 1048576], got '") + val + "'";
    } else if (arg == "--ffn-dim") {
      if (!parse_int(val, 1, 1 << 20, o.ffn_dim)) return std::string("--ffn-dim must be an integer in [1, 1048576], got '") + val + "'";
    } else if (arg == "--gemm") {
      o.gemm = val;
      if (o.gemm != "sgemm" && o.gemm != "onednn-fp32" && o.gemm != "onednn-bf16")
        return "--gemm must be sgemm, onednn-fp32 or onednn-bf16, got '" + o.gemm + "'";
    } else if (arg == "--n-layer") {
      if (!parse_int(val, 1, 1024, o.n_layer)) return std::string("--n-layer must be an integer in [1, 1024], got '") + val + "'";
    }
  }
  return "";
}

void print_help() {
  std::printf(
      "usage: mpiexec -n R %s [--json OUT] [--seconds S] [--rows N] [--d-model C] [--vocab V] [--n-layer L]\n"
      "                          [--ffn-dim F] [--gated] [--gemm sgemm|onednn-fp32|onednn-bf16]\n"
      "\n"
      "Single-thread OpenBLAS sgemm rate (GFLOP/s) on the reference model's GEMM shapes, all ranks\n"
      "busy at once. Prints a table; rank 0 writes JSON with the median per-rank rate.\n"
      "\n"
      "  --json OUT     write results to OUT (via OUT.tmp + rename)\n"
      "  --seconds S    approximate timed duration (default 2.5)\n"
      "  --rows N       tokens per rank per step, the GEMM M dimension (default 2048 = 8 x 256)\n"
      "  --d-model C    model width (default 256)\n"
      "  --vocab V      vocabulary size, lm head width (default 4096; 0 = no lm head, a classifier)\n"
      "  --n-layer L    layers, the weight of the block shapes in the aggregate (default 4)\n"
      "  --ffn-dim F    MLP hidden size (default 4 x d_model)\n"
      "  --gated        gated MLP (SwiGLU): the fc GEMM is C -> 2F ([gate | up])\n"
      "  --gemm G       sgemm (default: OpenBLAS), onednn-fp32 (oneDNN's fp32 matmul) or onednn-bf16\n"
      "                 (oneDNN's bf16 x bf16 -> fp32 matmul, on operands already in bf16)\n"
      "  -h, --help     show this help\n",
      kProg);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string trim(const char* s) {
  std::string t = s ? s : "";
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n')) t.pop_back();
  return t;
}

int run(int rank, int ranks, int argc, char** argv) {
  Options o;
  bool help = false;
  const std::string err = parse_args(argc, argv, o, help);
  if (help) {
    if (rank == 0) print_help();
    return 0;
  }
  if (!err.empty()) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s (see --help)\n", kProg, err.c_str());
    return 1;
  }

  // Check the JSON path before spending time measuring.
  int json_ok = 1;
  const std::string json_tmp = o.json + ".tmp";
  if (rank == 0 && !o.json.empty()) {
    FILE* f = std::fopen(json_tmp.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "%s: error: cannot write --json '%s': %s (check the directory exists and is writable)\n",
                   kProg, json_tmp.c_str(), std::strerror(errno));
      json_ok = 0;
    } else {
      std::fclose(f);
      std::remove(json_tmp.c_str());
    }
  }
  MPI_Bcast(&json_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!json_ok) return 1;
  std::string why;
  if (o.gemm == "onednn-bf16" && !llmpi::cpu::onednn_bf16_available(&why)) {
    if (rank == 0) std::fprintf(stderr, "%s: error: --gemm onednn-bf16: %s\n", kProg, why.c_str());
    return 1;
  }
  if (o.gemm == "onednn-fp32" && llmpi::cpu::onednn_matmul_impl(false, false, true, 16, 16, 16).empty()) {
    if (rank == 0) std::fprintf(stderr, "%s: error: --gemm onednn-fp32: this build has no oneDNN\n", kProg);
    return 1;
  }

  openblas_set_num_threads(1);

  const std::vector<Shape> shapes = model_shapes(o);
  size_t max_a = 0, max_b = 0, max_c = 0;
  for (const auto& s : shapes) {
    max_a = std::max(max_a, static_cast<size_t>(s.m) * s.k);
    max_b = std::max(max_b, static_cast<size_t>(s.k) * s.n);
    max_c = std::max(max_c, static_cast<size_t>(s.m) * s.n);
  }
  uint64_t seed = 0x5eed0000ull + static_cast<uint64_t>(rank);
  Buffers buf;
  buf.a = alloc_floats(max_a, seed);
  buf.b = alloc_floats(max_b, seed);
  buf.c = alloc_floats(max_c, seed);
  for (size_t i = 0; i < max_c; ++i) buf.c[i] *= 1e-3f;  // dW accumulates into C: keep it small
  if (o.gemm == "onednn-bf16") {
    for (size_t i = 0; i < max_a; ++i) buf.a16.push_back(llmpi::float_to_bf16_bits(buf.a[i]));
    for (size_t i = 0; i < max_b; ++i) buf.b16.push_back(llmpi::float_to_bf16_bits(buf.b[i]));
  }

  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };

  // Warm-up round (not recorded), which also sizes the run: every rank does the same number
  // of rounds, so they stay in step.
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = clock::now();
  for (const auto& s : shapes) run_gemm(o.gemm, s, buf);
  double round_s = seconds_since(t0);
  MPI_Allreduce(MPI_IN_PLACE, &round_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const int rounds = std::max(5, std::min(1000, static_cast<int>(std::lround(o.seconds / round_s))));

  std::vector<std::vector<double>> times(shapes.size());
  const auto t_start = clock::now();
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t = clock::now();
      run_gemm(o.gemm, shapes[i], buf);
      times[i].push_back(seconds_since(t));
    }
  }
  const double wall_s = seconds_since(t_start);

  // Per-rank results: each shape's median time per call, and the model-weighted aggregate.
  const size_t ns = shapes.size();
  std::vector<double> mine(ns + 1);
  double w_flops = 0, w_time = 0;
  for (size_t i = 0; i < ns; ++i) {
    const double t = median(times[i]);
    mine[i] = shapes[i].flops() / t / 1e9;
    w_flops += shapes[i].weight * shapes[i].flops();
    w_time += shapes[i].weight * t;
  }
  mine[ns] = w_flops / w_time / 1e9;

  std::vector<double> all(rank == 0 ? (ns + 1) * ranks : 0);
  MPI_Gather(mine.data(), static_cast<int>(ns + 1), MPI_DOUBLE, all.data(), static_cast<int>(ns + 1), MPI_DOUBLE, 0,
             MPI_COMM_WORLD);
  std::free(buf.a);
  std::free(buf.b);
  std::free(buf.c);
  if (rank != 0) return 0;

  auto per_rank = [&](size_t i) {
    std::vector<double> v;
    for (int r = 0; r < ranks; ++r) v.push_back(all[r * (ns + 1) + i]);
    return v;
  };
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.2f", i ? ", " : "", v[i]);
      s += b;
    }
    return s + "]";
  };
  const std::vector<double> agg = per_rank(ns);
  const double agg_med = median(agg);
  const std::string core = trim(openblas_get_corename());
  const std::string config = trim(openblas_get_config());
  const int parallel = openblas_get_parallel();
  const char* parallel_name = parallel == 2 ? "openmp" : parallel == 1 ? "pthreads" : "sequential";
  // The file the loader took cblas_sgemm from (update-alternatives and -rpath decide which).
  Dl_info where{};
  const std::string library =
      dladdr(reinterpret_cast<void*>(&cblas_sgemm), &where) && where.dli_fname ? where.dli_fname : "?";

  // oneDNN's implementation of each shape (e.g. "brg:avx512_core_bf16"); "" for sgemm
  std::vector<std::string> impl(ns);
  if (o.gemm != "sgemm")
    for (size_t i = 0; i < ns; ++i) {
      const auto& s = shapes[i];
      impl[i] = llmpi::cpu::onednn_matmul_impl(o.gemm == "onednn-bf16", std::strcmp(s.op, "TN") == 0,
                                               std::strcmp(s.op, "NT") == 0, s.m, s.n, s.k);
    }
  if (o.gemm == "sgemm")
    std::printf("sgemm rate: %d rank(s) x 1 thread, OpenBLAS %s (%s; %s build, %s), %d rounds in %.2f s\n", ranks,
                core.c_str(), config.c_str(), parallel_name, library.c_str(), rounds, wall_s);
  else
    std::printf("%s rate: %d rank(s) x 1 thread, oneDNN, %d rounds in %.2f s\n", o.gemm.c_str(), ranks, rounds, wall_s);
  std::printf("  %-16s %-3s %6s %6s %6s %6s  %10s  %s\n", "shape", "op", "M", "N", "K", "x/step", "GFLOP/s", "per rank");
  for (size_t i = 0; i < ns; ++i) {
    const auto& s = shapes[i];
    const auto v = per_rank(i);
    std::printf("  %-16s %-3s %6d %6d %6d %6d  %10.1f  %s  %s\n", s.name.c_str(), s.op, s.m, s.n, s.k, s.weight,
                median(v), list(v).c_str(), impl[i].c_str());
  }
  std::printf("  %-16s %-3s %6s %6s %6s %6s  %10.1f  %s\n", "FLOP-weighted", "", "", "", "", "", agg_med,
              list(agg).c_str());
  std::printf("gflops_per_rank_median: %.1f GFLOP/s (model-weighted aggregate, median over %d rank(s))\n", agg_med,
              ranks);

  if (!o.json.empty()) {
    FILE* f = std::fopen(json_tmp.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "%s: error: cannot write '%s': %s\n", kProg, json_tmp.c_str(), std::strerror(errno));
      return 1;
    }
    std::fprintf(f, "{\n  \"tool\": \"sgemm_rate\",\n  \"gemm\": \"%s\",\n  \"ranks\": %d,\n  \"threads_per_rank\": 1,\n",
                 o.gemm.c_str(), ranks);
    std::fprintf(f, "  \"gflops_per_rank_median\": %.3f,\n  \"gflops_per_rank\": %s,\n", agg_med, list(agg).c_str());
    std::fprintf(f, "  \"aggregate\": \"sum(weight*flops)/sum(weight*median_time) over shapes; weight = calls per training step\",\n");
    std::fprintf(f, "  \"openblas_corename\": \"%s\",\n  \"openblas_config\": \"%s\",\n", json_escape(core).c_str(),
                 json_escape(config).c_str());
    std::fprintf(f, "  \"openblas_parallel\": \"%s\",\n  \"openblas_library\": \"%s\",\n", parallel_name,
                 json_escape(library).c_str());
    std::fprintf(f,
                 "  \"config\": {\"rows\": %d, \"d_model\": %d, \"vocab\": %d, \"n_layer\": %d, \"ffn_dim\": %d, "
                 "\"gated\": %s},\n",
                 o.rows, o.d_model, o.vocab, o.n_layer, o.ffn_dim > 0 ? o.ffn_dim : 4 * o.d_model,
                 o.gated ? "true" : "false");
    std::fprintf(f, "  \"rounds\": %d,\n  \"seconds\": %.3f,\n  \"shapes\": [\n", rounds, wall_s);
    for (size_t i = 0; i < ns; ++i) {
      const auto& s = shapes[i];
      const auto v = per_rank(i);
      std::fprintf(f,
                   "    {\"name\": \"%s\", \"op\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"weight\": %d, "
                   "\"gflops_median\": %.3f, \"gflops_per_rank\": %s, \"onednn_impl\": \"%s\"}%s\n",
                   s.name.c_str(), s.op, s.m, s.n, s.k, s.weight, median(v), list(v).c_str(),
                   json_escape(impl[i]).c_str(), i + 1 < ns ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    const bool ok = std::fflush(f) == 0 && !std::ferror(f);
    if (std::fclose(f) != 0 || !ok || std::rename(json_tmp.c_str(), o.json.c_str()) != 0) {
      std::fprintf(stderr, "%s: error: writing '%s' failed: %s\n", kProg, o.json.c_str(), std::strerror(errno));
      std::remove(json_tmp.c_str());
      return 1;
    }
    std::printf("wrote %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The OpenBLAS kernels llmpi-train runs on (backend/cpu/gemm_auto.h), so the ceiling is its own.
  llmpi::cpu::exec_with_fitting_openblas_kernels(argv);
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int rc = run(rank, ranks, argc, argv);
  MPI_Finalize();
  return rc;
}
