// CUDA backend (kernels/*.cu) against the CPU backend, the numerical reference:
//  - every op on fresh random inputs: norm-wise relative error ‖gpu − cpu‖/‖cpu‖ < 1e-5 (fp32).
//    Outputs are poisoned with NaN before each run, so an element a kernel forgets to write fails;
//    gradients start from the same random non-zero values on both sides (the "+=" convention of
//    backend/ops.h) and the ADDED parts are compared;
//  - the whole GPT-2 model: loss and every parameter gradient within 1e-4 of the CPU model, and
//    50 AdamW steps following the CPU loss curve within 1e-3 (relative).
// Every GPU test skips ("no GPU: <reason>") when cuda_available() is false, so the suite passes on
// machines without a GPU or built without CUDA; CudaBackend.AvailabilityMatchesMachine runs
// everywhere and checks that the answer (and its reason) fits the machine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "grad_check.h"
#include "model/gpt2.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

constexpr double kOpTol = 1e-5;
constexpr double kModelTol = 1e-4;
constexpr double kCurveTol = 1e-3;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// First statement of every GPU test.
#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    std::string why_;                                                   \
    if (!cuda_available(&why_)) GTEST_SKIP() << "no GPU: " << why_;     \
    cuda_bind_device(0);                                                \
  } while (0)

const Ops& gpu() { return cuda_ops(); }
const Ops& cpu() { return cpu_ops(); }

// A device buffer of the CUDA backend, filled from / read back to host vectors.
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : p(gpu().alloc(b)), bytes(b) {}
  template <typename T>
  explicit Dev(const std::vector<T>& h) : Dev(h.size() * sizeof(T)) {
    gpu().copy_to_device(p, h.data(), bytes);
  }
  ~Dev() { gpu().free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  float* f() { return static_cast<float*>(p); }
  int32_t* i() { return static_cast<int32_t*>(p); }
  std::vector<float> get() const {
    std::vector<float> h(bytes / sizeof(float));
    gpu().copy_to_host(h.data(), p, bytes);
    return h;
  }
};

std::vector<float> nans(size_t n) { return std::vector<float>(n, kNaN); }

// ‖a − ref‖/‖ref‖ for float vectors.
double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return rel_err(a, to_double(ref));
}
// The parts an op added to buffers that started at `before`.
std::vector<float> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> d(after.size());
  for (size_t k = 0; k < after.size(); k++) d[k] = after[k] - before[k];
  return d;
}
bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

// ---- runs without a GPU ----------------------------------------------------------------------------

TEST(CudaBackend, AvailabilityMatchesMachine) {
  std::string why = "unset";
  const bool avail = cuda_available(&why);
#ifndef LLMPI_HAVE_CUDA
  EXPECT_FALSE(avail);
  EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
  EXPECT_THROW(cuda_ops(), Error);
  EXPECT_THROW(cuda_bind_device(0), Error);
  return;
#endif
  // A GPU machine is one with the NVIDIA driver's device node (override: LLMPI_EXPECT_GPU=0|1).
  const char* env = std::getenv("LLMPI_EXPECT_GPU");
  const bool expect_gpu = env ? std::string(env) == "1" : access("/dev/nvidiactl", F_OK) == 0;
  if (expect_gpu) {
    EXPECT_TRUE(avail) << "this machine has an NVIDIA driver node but cuda_available() says: "
                       << why;
    EXPECT_TRUE(why.empty()) << why;
  } else {
    EXPECT_FALSE(avail) << "no /dev/nvidiactl here, yet a GPU was reported";
    EXPECT_FALSE(why.empty());
    EXPECT_THROW(cuda_bind_device(0), Error);
    std::printf("[          ] cuda_available() = false: %s\n", why.c_str());
  }
}

// ---- the op table and memory -----------------------------------------------------------------------

TEST(CudaOps, TableIsComplete) {
  REQUIRE_GPU();
  const Ops& o = gpu();
  EXPECT_STREQ(o.name, "cuda");
  const void* fns[] = {(void*)o.alloc, (void*)o.free, (void*)o.zero, (void*)o.copy_to_device,
                       (void*)o.copy_to_host, (void*)o.embedding_forward,
                       (void*)o.embedding_backward, (void*)o.layernorm_forward,
                       (void*)o.layernorm_backward, (void*)o.matmul_forward,
                       (void*)o.matmul_backward, (void*)o.attention_forward,
                       (void*)o.attention_backward, (void*)o.gelu_forward, (void*)o.gelu_backward,
                       (void*)o.residual_forward, (void*)o.softmax_xent, (void*)o.adamw_update,
                       (void*)o.sgd_update, (void*)o.sum_squares, (void*)o.scale};
  for (const void* f : fns) EXPECT_NE(f, nullptr);
}

TEST(CudaOps, MemoryIsZeroFilledAndCopies) {
  REQUIRE_GPU();
  Dev d(1000 * sizeof(float));
  for (float x : d.get()) ASSERT_EQ(x, 0.0f);
  const auto h = random_floats(1000, 1);
  gpu().copy_to_device(d.p, h.data(), d.bytes);
  EXPECT_EQ(d.get(), h);
  gpu().zero(d.f() + 10, 20 * sizeof(float));
  const auto z = d.get();
  for (int k = 0; k < 1000; k++) ASSERT_EQ(z[k], k >= 10 && k < 30 ? 0.0f : h[k]) << k;
  void* empty = gpu().alloc(0);
  EXPECT_NE(empty, nullptr);
  gpu().free(empty);
  gpu().free(nullptr);
}

// ---- embedding ---------------------------------------------------------------------------------------

TEST(CudaOps, EmbeddingForward) {
  REQUIRE_GPU();
  const int B = 3, T = 17, C = 40, V = 13;
  const auto inp = random_ints(B * T, 2, 0, V);
  const auto wte = random_floats(V * C, 3), wpe = random_floats(T * C, 4);
  std::vector<float> ref(B * T * C, kNaN);
  cpu().embedding_forward(ref.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  Dev dinp(inp), dwte(wte), dwpe(wpe), out(nans(B * T * C));
  gpu().embedding_forward(out.f(), dinp.i(), dwte.f(), dwpe.f(), B, T, C);
  EXPECT_LT(rel(out.get(), ref), kOpTol);
}

TEST(CudaOps, EmbeddingBackward) {
  REQUIRE_GPU();
  for (int C : {40, 768}) {
    const int B = 4, T = 33, V = 11;  // many repeated tokens
    auto inp = random_ints(B * T, 5, 0, V);
    inp[0] = V - 1;
    const auto dout = random_floats(B * T * C, 6);
    const auto dwte0 = random_floats(V * C, 7), dwpe0 = random_floats(T * C, 8);
    auto rwte = dwte0, rwpe = dwpe0;
    cpu().embedding_backward(rwte.data(), rwpe.data(), dout.data(), inp.data(), B, T, C);
    Dev dinp(inp), ddout(dout), dwte(dwte0), dwpe(dwpe0);
    gpu().embedding_backward(dwte.f(), dwpe.f(), ddout.f(), dinp.i(), B, T, C);
    const auto gwte = dwte.get(), gwpe = dwpe.get();
    EXPECT_LT(rel(added(gwte, dwte0), added(rwte, dwte0)), kOpTol) << "C=" << C;
    EXPECT_LT(rel(added(gwpe, dwpe0), added(rwpe, dwpe0)), kOpTol) << "C=" << C;
    // Same summation order as the CPU loop (sorted runs in position order): the same bits.
    EXPECT_EQ(gwte, rwte) << "C=" << C;
    EXPECT_EQ(gwpe, rwpe) << "C=" << C;
  }
}

// ---- layernorm -------------------------------------------------------------------------------------------

TEST(CudaOps, LayerNormForward) {
  REQUIRE_GPU();
  for (int C : {37, 768}) {
    const int N = 45;
    auto x = random_floats(N * C, 9, -2.0f, 2.0f);
    for (int c = 0; c < C; c++) x[c] += 100.0f;  // a row with a large mean
    const auto w = random_floats(C, 10), b = random_floats(C, 11);
    std::vector<float> ro(N * C), rm(N), rr(N);
    cpu().layernorm_forward(ro.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), N, C);
    Dev dx(x), dw(w), db(b), out(nans(N * C)), mean(nans(N)), rstd(nans(N));
    gpu().layernorm_forward(out.f(), mean.f(), rstd.f(), dx.f(), dw.f(), db.f(), N, C);
    EXPECT_LT(rel(out.get(), ro), kOpTol) << "C=" << C;
    EXPECT_LT(rel(mean.get(), rm), kOpTol) << "C=" << C;
    EXPECT_LT(rel(rstd.get(), rr), kOpTol) << "C=" << C;
  }
}

TEST(CudaOps, LayerNormBackward) {
  REQUIRE_GPU();
  for (int C : {37, 768}) {
    const int N = 100;  // several row chunks of the column sums, the last one partial
    const auto x = random_floats(N * C, 12, -2.0f, 2.0f);
    const auto w = random_floats(C, 13), b = random_floats(C, 14);
    const auto dout = random_floats(N * C, 15);
    std::vector<float> ro(N * C), rm(N), rr(N);
    cpu().layernorm_forward(ro.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), N, C);
    const auto dx0 = random_floats(N * C, 16), dw0 = random_floats(C, 17), db0 = random_floats(C, 18);
    auto rdx = dx0, rdw = dw0, rdb = db0;
    cpu().layernorm_backward(rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(), w.data(),
                             rm.data(), rr.data(), N, C);
    Dev gx(x), gw(w), gdout(dout), gm(rm), gr(rr), gdx(dx0), gdw(dw0), gdb(db0);
    gpu().layernorm_backward(gdx.f(), gdw.f(), gdb.f(), gdout.f(), gx.f(), gw.f(), gm.f(), gr.f(), N,
                             C);
    EXPECT_LT(rel(added(gdx.get(), dx0), added(rdx, dx0)), kOpTol) << "C=" << C;
    EXPECT_LT(rel(added(gdw.get(), dw0), added(rdw, dw0)), kOpTol) << "C=" << C;
    EXPECT_LT(rel(added(gdb.get(), db0), added(rdb, db0)), kOpTol) << "C=" << C;
  }
}

// ---- matmul ---------------------------------------------------------------------------------------------------

TEST(CudaOps, MatmulForward) {
  REQUIRE_GPU();
  const int N = 37, C = 70, OC = 53;
  const auto x = random_floats(N * C, 19), w = random_floats(OC * C, 20), b = random_floats(OC, 21);
  for (bool with_bias : {true, false}) {
    std::vector<float> ref(N * OC);
    cpu().matmul_forward(ref.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
    Dev dx(x), dw(w), db(b), out(nans(N * OC));
    gpu().matmul_forward(out.f(), dx.f(), dw.f(), with_bias ? db.f() : nullptr, N, C, OC);
    EXPECT_LT(rel(out.get(), ref), kOpTol) << "bias " << with_bias;
  }
}

TEST(CudaOps, MatmulBackward) {
  REQUIRE_GPU();
  const int N = 100, C = 70, OC = 53;
  const auto x = random_floats(N * C, 22), w = random_floats(OC * C, 23);
  const auto dout = random_floats(N * OC, 24);
  const auto dx0 = random_floats(N * C, 25), dw0 = random_floats(OC * C, 26),
             db0 = random_floats(OC, 27);
  for (int variant = 0; variant < 2; variant++) {  // 0: all gradients; 1: dinp and dbias null
    const bool all = variant == 0;
    auto rdx = dx0, rdw = dw0, rdb = db0;
    cpu().matmul_backward(all ? rdx.data() : nullptr, rdw.data(), all ? rdb.data() : nullptr,
                          dout.data(), x.data(), w.data(), N, C, OC);
    Dev gx(x), gw(w), gdout(dout), gdx(dx0), gdw(dw0), gdb(db0);
    gpu().matmul_backward(all ? gdx.f() : nullptr, gdw.f(), all ? gdb.f() : nullptr, gdout.f(),
                          gx.f(), gw.f(), N, C, OC);
    EXPECT_LT(rel(added(gdw.get(), dw0), added(rdw, dw0)), kOpTol) << variant;
    if (all) {
      EXPECT_LT(rel(added(gdx.get(), dx0), added(rdx, dx0)), kOpTol);
      EXPECT_LT(rel(added(gdb.get(), db0), added(rdb, db0)), kOpTol);
    } else {
      EXPECT_EQ(gdx.get(), dx0);
      EXPECT_EQ(gdb.get(), db0);
    }
  }
}

// ---- attention ----------------------------------------------------------------------------------------------

namespace {
void check_attention(int B, int T, int C, int NH, uint32_t seed) {
  const size_t att_n = static_cast<size_t>(B) * NH * T * T;
  const auto qkv = random_floats(static_cast<size_t>(B) * T * 3 * C, seed, -2.0f, 2.0f);
  std::vector<float> rout(B * T * C), ratt(att_n);
  cpu().attention_forward(rout.data(), ratt.data(), qkv.data(), B, T, C, NH);
  Dev gqkv(qkv), gout(nans(B * T * C)), gatt(nans(att_n));
  gpu().attention_forward(gout.f(), gatt.f(), gqkv.f(), B, T, C, NH);
  const auto att = gatt.get();
  EXPECT_LT(rel(gout.get(), rout), kOpTol) << "forward out, T=" << T;
  EXPECT_LT(rel(att, ratt), kOpTol) << "forward att, T=" << T;
  for (int r = 0; r < B * NH * T; r++)  // exact zeros above the diagonal
    for (int j = r % T + 1; j < T; j++) ASSERT_EQ(att[static_cast<size_t>(r) * T + j], 0.0f);

  const auto dout = random_floats(B * T * C, seed + 1);
  const auto dqkv0 = random_floats(qkv.size(), seed + 2);
  auto rdqkv = dqkv0;
  std::vector<float> rscratch(att_n);
  cpu().attention_backward(rdqkv.data(), rscratch.data(), dout.data(), qkv.data(), ratt.data(), B,
                           T, C, NH);
  Dev gdout(dout), gdqkv(dqkv0), gscratch(nans(att_n));
  gpu().attention_backward(gdqkv.f(), gscratch.f(), gdout.f(), gqkv.f(), gatt.f(), B, T, C, NH);
  const auto gd = gdqkv.get();
  EXPECT_TRUE(all_finite(gd)) << "backward T=" << T;
  EXPECT_LT(rel(added(gd, dqkv0), added(rdqkv, dqkv0)), kOpTol) << "backward, T=" << T;
}
}  // namespace

TEST(CudaOps, AttentionSmall) {
  REQUIRE_GPU();
  check_attention(2, 5, 8, 2, 30);
  check_attention(1, 1, 8, 2, 31);  // a single position
}

TEST(CudaOps, AttentionLonger) {
  REQUIRE_GPU();
  check_attention(2, 67, 48, 4, 32);  // T across the CPU's 64-row blocks, hs = 12
  check_attention(1, 130, 64, 1, 33);
}

// ---- elementwise -------------------------------------------------------------------------------------------------

TEST(CudaOps, Gelu) {
  REQUIRE_GPU();
  const size_t n = 100003;
  const auto x = random_floats(n, 34, -12.0f, 12.0f);
  std::vector<float> ref(n);
  cpu().gelu_forward(ref.data(), x.data(), n);
  Dev gx(x), gout(nans(n));
  gpu().gelu_forward(gout.f(), gx.f(), n);
  EXPECT_LT(rel(gout.get(), ref), kOpTol);

  const auto dout = random_floats(n, 35), d0 = random_floats(n, 36);
  auto rd = d0;
  cpu().gelu_backward(rd.data(), x.data(), dout.data(), n);
  Dev gdout(dout), gd(d0);
  gpu().gelu_backward(gd.f(), gx.f(), gdout.f(), n);
  EXPECT_LT(rel(added(gd.get(), d0), added(rd, d0)), kOpTol);
}

TEST(CudaOps, ResidualForward) {
  REQUIRE_GPU();
  const size_t n = 70001;
  const auto a = random_floats(n, 37), b = random_floats(n, 38);
  std::vector<float> ref(n);
  cpu().residual_forward(ref.data(), a.data(), b.data(), n);
  Dev ga(a), gb(b), gout(nans(n));
  gpu().residual_forward(gout.f(), ga.f(), gb.f(), n);
  EXPECT_LT(rel(gout.get(), ref), kOpTol);
  gpu().residual_forward(ga.f(), ga.f(), gb.f(), n);  // out aliases a
  EXPECT_LT(rel(ga.get(), ref), kOpTol);
}

// ---- softmax + cross-entropy -----------------------------------------------------------------------------------

TEST(CudaOps, SoftmaxXent) {
  REQUIRE_GPU();
  const int N = 7, V = 5003;
  auto z = random_floats(N * V, 39, -4.0f, 4.0f);
  z[3] = 60.0f;  // a dominant logit
  const auto y = random_ints(N, 40, 0, V);
  for (float gs : {0.0f, 0.37f}) {
    auto rz = z;
    std::vector<float> rl(N);
    cpu().softmax_xent(rz.data(), rl.data(), y.data(), N, V, gs);
    Dev gz(z), gl(nans(N)), gy(y);
    gpu().softmax_xent(gz.f(), gl.f(), gy.i(), N, V, gs);
    EXPECT_LT(rel(gl.get(), rl), kOpTol) << "grad_scale " << gs;
    if (gs == 0.0f)
      EXPECT_EQ(gz.get(), z) << "logits must stay untouched without a gradient";
    else
      EXPECT_LT(rel(gz.get(), rz), kOpTol);
  }
}

TEST(CudaOps, SoftmaxXentRejectsTargetOutsideVocabulary) {
  REQUIRE_GPU();
  const int N = 3, V = 10;
  Dev z(random_floats(N * V, 41)), l(nans(N)), y(std::vector<int32_t>{1, 10, 2});
  try {
    gpu().softmax_xent(z.f(), l.f(), y.i(), N, V, 1.0f);
    ADD_FAILURE() << "no error for target 10 with V = 10";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 at row 1"), std::string::npos) << e.what();
  }
}

// ---- optimizer and gradient utilities ---------------------------------------------------------------------

TEST(CudaOps, AdamWMatchesCpuOverSteps) {
  REQUIRE_GPU();
  const size_t n = 50001;
  auto p = random_floats(n, 42), m = std::vector<float>(n, 0.0f), v = m;
  Dev gp(p), gm(m), gv(v);
  for (int t = 1; t <= 5; t++) {
    const auto g = random_floats(n, 43 + t);
    cpu().adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                       t);
    Dev gg(g);
    gpu().adamw_update(gp.f(), gg.f(), gm.f(), gv.f(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
  }
  EXPECT_LT(rel(gp.get(), p), kOpTol);
  EXPECT_LT(rel(gm.get(), m), kOpTol);
  EXPECT_LT(rel(gv.get(), v), kOpTol);
}

TEST(CudaOps, SgdUpdate) {
  REQUIRE_GPU();
  const size_t n = 30011;
  auto p = random_floats(n, 50);
  const auto g = random_floats(n, 51);
  Dev gp(p), gg(g);
  cpu().sgd_update(p.data(), g.data(), n, 0.05f, 0.1f);
  gpu().sgd_update(gp.f(), gg.f(), n, 0.05f, 0.1f);
  EXPECT_LT(rel(gp.get(), p), kOpTol);
}

TEST(CudaOps, SumSquaresAndScale) {
  REQUIRE_GPU();
  for (size_t n : {size_t(1), size_t(1000), size_t(3000017)}) {
    const auto x = random_floats(n, 52);
    Dev gx(x);
    const double rc = cpu().sum_squares(x.data(), n);
    const double rg = gpu().sum_squares(gx.f(), n);
    EXPECT_LT(std::fabs(rg - rc) / rc, 1e-10) << n;  // both accumulate in double
    EXPECT_EQ(gpu().sum_squares(gx.f(), n), rg) << "not deterministic, n=" << n;
    auto xs = x;
    cpu().scale(xs.data(), 0.3f, n);
    gpu().scale(gx.f(), 0.3f, n);
    EXPECT_EQ(gx.get(), xs) << n;
  }
}

// ---- the whole model ------------------------------------------------------------------------------------------------

namespace {
const ModelShape kShape{2, 4, 64, 32, 97};  // n_layer, n_head, d_model, max_seq_len, vocab
}

TEST(CudaModel, LossAndEveryGradientMatchCpu) {
  REQUIRE_GPU();
  const int B = 3, T = 32;
  const auto in = random_ints(B * T, 60, 0, kShape.vocab_size);
  const auto tg = random_ints(B * T, 61, 0, kShape.vocab_size);
  Gpt2 mc(kShape, cpu()), mg(kShape, gpu());
  mc.init_params(7, 0.05);
  mg.init_params(7, 0.05);
  mc.zero_grads();
  mg.zero_grads();
  const float lc = mc.forward(in.data(), tg.data(), B, T, true);
  const float lg = mg.forward(in.data(), tg.data(), B, T, true);
  EXPECT_LT(std::fabs(lg - lc) / std::fabs(lc), kModelTol) << lg << " vs " << lc;
  mc.backward();
  mg.backward();
  const size_t n = mc.table.numel;
  std::vector<float> gc(n), gg(n);
  cpu().copy_to_host(gc.data(), mc.grads, n * sizeof(float));
  gpu().copy_to_host(gg.data(), mg.grads, n * sizeof(float));
  for (const ParamSlice& s : mc.table.slices) {
    const std::vector<float> a(gg.begin() + s.offset, gg.begin() + s.offset + s.numel);
    const std::vector<float> r(gc.begin() + s.offset, gc.begin() + s.offset + s.numel);
    EXPECT_LT(rel(a, r), kModelTol) << s.name;
  }
}

TEST(CudaModel, AdamWTrainingFollowsCpuLossCurve) {
  REQUIRE_GPU();
  const int B = 4, T = 32, steps = 50;
  Gpt2 mc(kShape, cpu()), mg(kShape, gpu());
  mc.init_params(11, 0.02);
  mg.init_params(11, 0.02);
  const size_t n = mc.table.numel;
  float* cm = static_cast<float*>(cpu().alloc(n * sizeof(float)));
  float* cv = static_cast<float*>(cpu().alloc(n * sizeof(float)));
  Dev gm(n * sizeof(float)), gv(n * sizeof(float));
  // A small fixed data set of 4 batches, so the loss falls visibly within 50 steps.
  std::vector<std::vector<int32_t>> data;
  for (int k = 0; k < 4; k++) data.push_back(random_ints(B * (T + 1), 70 + k, 0, kShape.vocab_size));
  double worst = 0.0;
  float first = 0.0f, last = 0.0f;
  for (int step = 1; step <= steps; step++) {
    const auto& d = data[step % 4];
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        in[b * T + t] = d[b * (T + 1) + t];
        tg[b * T + t] = d[b * (T + 1) + t + 1];
      }
    float loss[2];
    Gpt2* models[2] = {&mc, &mg};
    float* ms[2] = {cm, gm.f()};
    float* vs[2] = {cv, gv.f()};
    for (int k = 0; k < 2; k++) {
      Gpt2& m = *models[k];
      const Ops& o = *m.ops;
      m.zero_grads();
      loss[k] = m.forward(in.data(), tg.data(), B, T, true);
      m.backward();
      const double norm = std::sqrt(o.sum_squares(m.grads, n));
      if (norm > 1.0) o.scale(m.grads, static_cast<float>(1.0 / norm), n);
      for (const ParamSlice& s : m.table.slices)
        o.adamw_update(m.params + s.offset, m.grads + s.offset, ms[k] + s.offset, vs[k] + s.offset,
                       s.numel, 3e-3f, 0.9f, 0.95f, 1e-8f, s.decay ? 0.1f : 0.0f, step);
    }
    worst = std::max(worst, std::fabs(static_cast<double>(loss[1]) - loss[0]) / loss[0]);
    if (step == 1) first = loss[0];
    last = loss[0];
  }
  cpu().free(cm);
  cpu().free(cv);
  EXPECT_LT(last, first - 0.5f) << "the CPU reference did not learn; the comparison means little";
  EXPECT_LT(worst, kCurveTol);
}
