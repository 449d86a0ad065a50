// "auto" of runtime.cpu_fp32_gemm / runtime.cpu_bf16_gemm (backend/cpu/gemm_auto.h) on one
// process; the trainer's part (every rank the same engine, a resume keeping it) is
// test_mpi_cpu_gemm_auto.cpp. Nothing here depends on which engine is faster on this machine:
//  - the choice is a pure function of the times (oneDNN at <= kAutoOnednnShare of the fallback's,
//    else the fallback; untimed or nonsense times: the fallback);
//  - the shapes timed are the Model's own: dense_layers() equals the matmul_forward calls of a
//    training forward, for every family, a chunked LM head and a part of the stack;
//  - the timed blocks are bounded (rows, FLOPs per thread) and merge equal shapes;
//  - a step under kAutoMinStepFlops is not timed; a larger one gets positive times for both
//    engines (where oneDNN runs) and leaves the selection as it found it;
//  - the banner's text: the times, OpenBLAS's core, the reason given to the selection;
//  - the OpenBLAS warning: generic kernels on a newer CPU name OPENBLAS_CORETYPE, others nothing;
//    the core llmpi-train starts again on is that fix, and none where OpenBLAS cannot change kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/gemm_auto.h"
#include "backend/cpu/onednn_gemm.h"
#include "backend/ops.h"
#include "model/dense_layers.h"
#include "model_test_util.h"

using namespace llmpi;

namespace {


// ---- the Model's matmul_forward calls, recorded ----

std::vector<std::tuple<int, int, int>> g_calls;  // (rows, in, out) of every dense-layer forward

const Ops& recording_ops() {
  static const Ops ops = [] {
    Ops o = cpu_ops();
    o.matmul_forward = [](float* out, const float* inp, const float* w, const float* b, int N, int C, int OC,
                          GemmMode g) {
      g_calls.emplace_back(N, C, OC);
      cpu_ops().matmul_forward(out, inp, w, b, N, C, OC, g);
    };
    o.matmul_gelu_forward = [](float* pre, float* act, const float* inp, const float* w, const float* b, int N, int C,
                               int OC, GemmMode g, uint16_t* act16) {
      g_calls.emplace_back(N, C, OC);
      cpu_ops().matmul_gelu_forward(pre, act, inp, w, b, N, C, OC, g, act16);
    };
    return o;
  }();
  return ops;
}

// The dense-layer forwards of one training forward of the whole model d on B x T tokens, sorted.
std::vector<std::tuple<int, int, int>> forward_calls(const ModelDesc& d, int B, int T) {
  Model m(d, recording_ops());
  m.init_params(1);
  Activations a(m, B, T);
  test::RandomBatch batch(d, B, T, 5);
  g_calls.clear();
  m.forward(a, batch.b, HeadMode::train);
  std::vector<std::tuple<int, int, int>> calls = g_calls;
  std::sort(calls.begin(), calls.end());
  return calls;
}

// dense_layers() with each shape repeated `count` times, sorted.
std::vector<std::tuple<int, int, int>> expanded(const std::vector<DenseShape>& layers) {
  std::vector<std::tuple<int, int, int>> calls;
  for (const DenseShape& s : layers)
    for (int i = 0; i < s.count; i++) calls.emplace_back(s.rows, s.in, s.out);
  std::sort(calls.begin(), calls.end());
  return calls;
}

}  // namespace

TEST(CpuGemmAuto, ChoiceFollowsTheTimesOnly) {
  // Exact: the constant is this literal.
  ASSERT_EQ(cpu::kAutoOnednnShare, 0.95) << "the cases below are written for: the faster, the fallback within 5%";
  const double share = cpu::kAutoOnednnShare, nan = std::numeric_limits<double>::quiet_NaN(),
               inf = std::numeric_limits<double>::infinity();
  struct Case {
    CpuGemmTimes t;
    bool onednn;
  };
  const Case cases[] = {
      {{1.0, 3.0}, true},             // oneDNN 3x faster (a generic OpenBLAS core)
      {{share * 2.0, 2.0}, true},     // exactly at the share: kept (share · 2.0 is one double both sides)
      {{share * 2.0 * 1.001, 2.0}, false},  // just above it
      {{1.0, 1.03}, false},           // a 3% gain: within 5%, the fallback stays
      {{1.0, 1.1}, true},             // a 10% gain: oneDNN
      {{2.0, 1.0}, false},            // the fallback faster
      {{1.0, 1.0}, false},            // a tie
      {{-1, -1}, false},              // not timed
      {{1.0, -1}, false},             // half timed
      {{0.0, 1.0}, false},            // nonsense times
      {{nan, 1.0}, false},
      {{1.0, inf}, false},
  };
  for (const Case& c : cases) {
    for (int again = 0; again < 2; again++) {  // the same times, the same choice
      EXPECT_EQ(cpu::auto_prefers_onednn(c.t), c.onednn) << c.t.onednn_s << " vs " << c.t.fallback_s;
      EXPECT_EQ(cpu::cpu_fp32_gemm_from_times(c.t), c.onednn ? CpuFp32Gemm::onednn : CpuFp32Gemm::openblas);
      EXPECT_EQ(cpu::cpu_bf16_gemm_from_times(c.t), c.onednn ? CpuBf16Gemm::onednn : CpuBf16Gemm::emulate);
    }
  }
}

TEST(CpuGemmAuto, DenseLayersAreTheModelsGemms) {
  struct Case {
    std::string what;
    ModelDesc d;
  };
  std::vector<Case> cases = {
      {"gpt2", test::desc_of("gpt2", 2, 2, 32, 16, 64)},
      {"llama, grouped K/V", test::desc_of("llama", 2, 4, 32, 16, 64, {"model.n_kv_head=2"})},
      {"bert", test::desc_of("bert", 2, 2, 32, 16, 64, {"model.num_labels=3"})},
      {"gpt2, LM head in chunks of 24 rows (the last 16)", test::desc_of("gpt2", 1, 2, 32, 16, 64)},
  };
  cases.back().d.lm_head_chunk_rows = 24;
  for (const Case& c : cases) {
    const int B = 4, T = 16;
    const std::vector<DenseShape> layers = dense_layers(c.d, ModelPart::whole(), B, T);
    ASSERT_FALSE(layers.empty()) << c.what;
    EXPECT_EQ(expanded(layers), forward_calls(c.d, B, T)) << c.what;
  }
  // A pipeline stage's part: its blocks only; the head's stage adds the head.
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 32, 16, 64);
  const std::vector<DenseShape> whole = dense_layers(d, ModelPart::whole(), 2, 16);
  ModelPart mid{1, 3, false, false}, last{3, -1, false, true};
  const std::vector<DenseShape> m = dense_layers(d, mid, 2, 16), l = dense_layers(d, last, 2, 16);
  ASSERT_EQ(m.size(), 4u);
  ASSERT_EQ(l.size(), 5u);
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(m[i].count, 2);
    EXPECT_EQ(l[i].count, 1);
    EXPECT_EQ(std::tie(m[i].rows, m[i].in, m[i].out), std::tie(whole[i].rows, whole[i].in, whole[i].out));
  }
  EXPECT_EQ(std::tie(l[4].rows, l[4].in, l[4].out, l[4].count),
            std::tie(whole[4].rows, whole[4].in, whole[4].out, whole[4].count));
}

TEST(CpuGemmAuto, TimedBlocksAreBoundedAndMergeEqualShapes) {
  // GPT-2 124M on 8 x 1024 rows: 12 blocks, the LM head in chunks of 1334 rows (and the rest).
  const ModelDesc d = test::desc_of("gpt2", 12, 12, 768, 1024, 50257);
  const std::vector<DenseShape> layers = dense_layers(d, ModelPart::whole(), 8, 1024);
  std::vector<DenseShape> twice = layers;  // two chunks of a pipeline stage: the same shapes again
  twice.insert(twice.end(), layers.begin(), layers.end());
  for (int threads : {1, 4, 32}) {
    const std::vector<cpu::TimedBlock> blocks = cpu::timed_blocks(twice, threads);
    ASSERT_EQ(blocks.size(), layers.size()) << "equal shapes are timed once";
    double flops = 0;
    for (size_t i = 0; i < blocks.size(); i++) {
      const DenseShape &s = blocks[i].shape, &b = blocks[i].block;
      EXPECT_EQ(std::tie(s.rows, s.in, s.out), std::tie(layers[i].rows, layers[i].in, layers[i].out));
      EXPECT_EQ(s.count, 2 * layers[i].count);
      EXPECT_EQ(b.count, 1);
      EXPECT_LE(b.rows, std::min(s.rows, cpu::kTimedRows));
      EXPECT_LE(b.in, s.in);
      EXPECT_LE(b.out, s.out);
      EXPECT_GE(std::min({b.rows, b.in, b.out}), std::min({s.rows, s.in, s.out, cpu::kTimedMinEdge}));
      flops += 6.0 * b.rows * b.in * b.out;
    }
    EXPECT_LE(flops, cpu::kTimedFlopsPerThread * threads) << threads << " threads";  // Exact: integers below 2^53
  }
  // A small model's shapes are timed as they are (rows capped).
  const ModelDesc small = test::desc_of("gpt2", 4, 4, 128, 128, 257);
  for (const cpu::TimedBlock& b : cpu::timed_blocks(dense_layers(small, ModelPart::whole(), 8, 128), 16))
    EXPECT_EQ(std::tie(b.block.rows, b.block.in, b.block.out),
              std::tie(std::min(b.shape.rows, cpu::kTimedRows), b.shape.in, b.shape.out));
  EXPECT_TRUE(cpu::timed_blocks({}, 1).empty());
  // Exact: products and sums of small integers, exact in double.
  EXPECT_DOUBLE_EQ(cpu::dense_step_flops({{8, 16, 32, 3}, {4, 2, 2, 1}}), 6.0 * (8 * 16 * 32 * 3 + 4 * 2 * 2));
}

TEST(CpuGemmAuto, SmallStepsAreNotTimedLargerOnesOnBothEngines) {
  for (GemmPrecision p : {GemmPrecision::fp32, GemmPrecision::bf16}) {
    const std::vector<DenseShape> tiny = {{64, 32, 32, 4}};
    ASSERT_LT(cpu::dense_step_flops(tiny), cpu::kAutoMinStepFlops);
    const CpuGemmTimes none = cpu::time_dense_layers(p, tiny);
    EXPECT_LT(none.onednn_s, 0);
    EXPECT_LT(none.fallback_s, 0);
    EXPECT_NE(cpu::describe_gemm_times(p, none).find("not timed"), std::string::npos);
    const std::vector<DenseShape> step = {{256, 256, 512, 1}};
    ASSERT_GE(cpu::dense_step_flops(step), cpu::kAutoMinStepFlops);
    const bool bf16 = p == GemmPrecision::bf16;
    const cpu::ScopedCpuFp32Gemm f(CpuFp32Gemm::openblas);
    const cpu::ScopedCpuBf16Gemm b(CpuBf16Gemm::emulate);
    const CpuGemmTimes t = cpu::time_dense_layers(p, step);
    if (!(bf16 ? cpu::onednn_bf16_available() : cpu::onednn_fp32_available())) {
      EXPECT_LT(t.onednn_s, 0) << "one candidate: nothing to time";
      continue;
    }
    EXPECT_TRUE(t.onednn_s > 0 && std::isfinite(t.onednn_s)) << t.onednn_s;
    EXPECT_TRUE(t.fallback_s > 0 && std::isfinite(t.fallback_s)) << t.fallback_s;
    EXPECT_EQ(cpu::cpu_fp32_gemm(), CpuFp32Gemm::openblas) << "the selection is the caller's again";
    EXPECT_EQ(cpu::cpu_bf16_gemm(), CpuBf16Gemm::emulate);
  }
}

TEST(CpuGemmAuto, BannerNamesTheTimesTheCoreAndTheReason) {
  const std::string f = cpu::describe_gemm_times(GemmPrecision::fp32, {0.0123, 0.0351});
  EXPECT_NE(f.find("timed this run's GEMMs: onednn 12.3 ms, openblas 35.1 ms per step"), std::string::npos) << f;
  EXPECT_NE(f.find("OpenBLAS core "), std::string::npos) << f;
  const std::string b = cpu::describe_gemm_times(GemmPrecision::bf16, {0.0123, 0.0351});
  EXPECT_NE(b.find("onednn 12.3 ms, emulate 35.1 ms per step"), std::string::npos) << b;
  {
    const cpu::ScopedCpuFp32Gemm s(CpuFp32Gemm::openblas);
    cpu::select_cpu_fp32_gemm(CpuFp32Gemm::openblas, "runtime.cpu_fp32_gemm \"auto\" " + f);
    const std::string d = cpu::cpu_fp32_gemm_description();
    EXPECT_NE(d.find("OpenBLAS sgemm: runtime.cpu_fp32_gemm \"auto\" timed this run's GEMMs: onednn 12.3 ms"),
              std::string::npos)
        << d;
  }
  {
    const cpu::ScopedCpuBf16Gemm s(CpuBf16Gemm::emulate);
    cpu::select_cpu_bf16_gemm(CpuBf16Gemm::emulate, "the reason");
    const std::string d = cpu::cpu_bf16_gemm_description();
    EXPECT_NE(d.find("emulated (operands rounded to bf16, fp32 OpenBLAS sgemm): the reason"), std::string::npos) << d;
  }
}

TEST(CpuGemmAuto, GenericOpenblasKernelsAreWarnedAbout) {
  EXPECT_EQ(cpu::openblas_core_level("Prescott"), 0);
  EXPECT_EQ(cpu::openblas_core_level("NEHALEM"), 0);
  EXPECT_EQ(cpu::openblas_core_level("Unknown"), 0);
  EXPECT_EQ(cpu::openblas_core_level("Sandybridge"), 1);
  EXPECT_EQ(cpu::openblas_core_level("Haswell"), 2);
  EXPECT_EQ(cpu::openblas_core_level("Zen"), 2);
  EXPECT_EQ(cpu::openblas_core_level("SkylakeX"), 3);
  EXPECT_EQ(cpu::openblas_core_level("Cooperlake"), 3);
  EXPECT_EQ(cpu::openblas_core_level("SapphireRapids"), 3);
  EXPECT_EQ(cpu::openblas_core_level("Loongson3R4"), -1);
  struct Case {
    const char* core;
    int cpu;
    const char* fix;  // "" = no warning
  };
  const Case cases[] = {
      {"Prescott", 3, "OPENBLAS_CORETYPE=SkylakeX"}, {"Core2", 2, "OPENBLAS_CORETYPE=Haswell"},
      {"Nehalem", 3, "OPENBLAS_CORETYPE=SkylakeX"},  {"Sandybridge", 3, "OPENBLAS_CORETYPE=SkylakeX"},
      {"Prescott", 1, ""},                           {"Nehalem", 0, ""},
      {"Sandybridge", 2, ""},                        {"Haswell", 3, ""},
      {"Zen", 3, ""},                                {"SkylakeX", 3, ""},
      {"Loongson3R4", 3, ""},
  };
  for (const Case& c : cases) {
    const std::string w = cpu::openblas_core_warning(c.core, c.cpu, true);
    if (*c.fix == '\0') {
      EXPECT_EQ(w, "") << c.core << " on level " << c.cpu;
      continue;
    }
    EXPECT_NE(w.find(c.fix), std::string::npos) << w;
    EXPECT_NE(w.find(std::string(c.core) + " kernels"), std::string::npos) << w;
  }
  // The core llmpi-train starts again on is the warning's fix, only where OpenBLAS can change kernels.
  for (const Case& c : cases) {
    const std::string fit = cpu::openblas_fitting_core(c.core, c.cpu, true);
    EXPECT_EQ(fit.empty(), *c.fix == '\0') << c.core << " on level " << c.cpu << ": " << fit;
    if (!fit.empty()) {
      EXPECT_EQ("OPENBLAS_CORETYPE=" + fit, c.fix);
    }
    EXPECT_EQ(cpu::openblas_fitting_core(c.core, c.cpu, false), "") << c.core << " on level " << c.cpu;
  }
  const std::string fixed = cpu::openblas_core_warning("Prescott", 3, false);
  EXPECT_NE(fixed.find("DYNAMIC_ARCH"), std::string::npos) << fixed;
  EXPECT_EQ(fixed.find("set OPENBLAS_CORETYPE"), std::string::npos) << fixed;
  const int level = cpu::cpu_vector_level();
  EXPECT_TRUE(level >= 0 && level <= 3) << level;
  cpu::openblas_core_warning();  // this process's: whatever it says, it says it without failing
}
