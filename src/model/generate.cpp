// Incremental forward with a key/value cache, and next-token choice: see generate.h.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_ops.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

// How many of x[0, n) are not finite, and the first of them (*first: its index).
size_t count_nonfinite(const float* x, size_t n, size_t* first) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!std::isfinite(x[i]) && bad++ == 0) *first = i;
  return bad;
}

std::string value_name(float v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

}  // namespace

std::string nonfinite_slice(const ParamSlice& s, const float* values) {
  size_t first = 0;
  const size_t bad = count_nonfinite(values, s.numel, &first);
  if (!bad) return "";
  return "tensor '" + s.name + "' holds " + std::to_string(bad) + " non-finite value" + (bad > 1 ? "s" : "") + " of " +
         std::to_string(s.numel) + " (the first, " + value_name(values[first]) + ", at element " +
         std::to_string(first) + ")";
}

std::string nonfinite_tensor(const ParamTable& t, const float* params) {
  for (const ParamSlice& s : t.slices) {
    std::string bad = nonfinite_slice(s, params + s.offset);
    if (!bad.empty()) return bad;
  }
  return "";
}

std::string generation_unsupported_reason(const Model& m) {
  const ModelDesc& d = m.desc;
  if (d.head != HeadKind::lm || !d.causal)
    return std::string("the ") + family_name(d.family) +
           " family is a bidirectional encoder with a classifier head, not a language model; text generation "
           "needs a gpt2 or llama model";
  if (!d.pre_norm) return "generation supports pre-norm language models only (gpt2, llama)";
  if (!(m.part.embedding && m.part.head && m.part.l0 == 0 && (m.part.l1 == d.n_layer)))
    return "generation needs the whole model (embedding, every block and the head), not a part of it";
  if (m.ops->device != Device::cpu)
    return "generation runs on the CPU backend only (the KV-cache attention is a host loop)";
  return "";
}

Generator::Generator(const Model& m, int capacity, bool kv_cache) : m_(m), o_(*m.ops), kv_cache_(kv_cache) {
  const std::string why = generation_unsupported_reason(m);
  if (!why.empty()) fail(why);
  const std::string bad = nonfinite_tensor(m.table, m.params);
  if (!bad.empty())
    fail("the model's weights are not finite: ", bad,
         "; every token would be chosen from NaN logits. The weights are damaged or their training diverged: "
         "use an earlier checkpoint");
  const ModelDesc& d = m.desc;
  cap_ = capacity <= 0 ? d.max_seq_len : std::min(capacity, d.max_seq_len);
  if (cap_ <= 0) fail("the model's max_seq_len is ", d.max_seq_len, "; it cannot hold any position");
  V_ = d.vocab_size;
  if (!kv_cache_) return;
  const size_t kv = static_cast<size_t>(d.n_kv_head) * d.head_dim();
  kcache_.assign(d.n_layer, std::vector<float>(static_cast<size_t>(cap_) * kv));
  vcache_.assign(d.n_layer, std::vector<float>(static_cast<size_t>(cap_) * kv));
  if (!d.learned_positions) {
    // The CPU rope op's table (backend/cpu/rope.cpp), made the same way so that the rotation at
    // position t is bitwise the one the full forward applies: f_i = theta^(-2i/hs) and a = t f_i
    // in double, then cos a and sin a rounded to float.
    const int hs = d.head_dim(), half = hs / 2;
    rope_cos_.resize(static_cast<size_t>(cap_) * half);
    rope_sin_.resize(static_cast<size_t>(cap_) * half);
    const double theta = static_cast<double>(static_cast<float>(d.rope_theta));
    for (int t = 0; t < cap_; t++)
      for (int i = 0; i < half; i++) {
        const double f = std::pow(theta, -2.0 * i / static_cast<double>(hs));
        const double a = static_cast<double>(t) * f;
        rope_cos_[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(a));
        rope_sin_[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(a));
      }
  }
}

void Generator::ensure_rows(int n) {
  if (n <= rows_) return;
  const ModelDesc& d = m_.desc;
  const size_t N = static_cast<size_t>(n), C = d.d_model;
  x_.resize(N * C);
  h_.resize(N * C);
  tmp_.resize(N * C);
  qkv_.resize(N * d.qkv_dim());
  atty_.resize(N * d.n_head * d.head_dim());
  fc_.resize(N * d.fc_dim());
  act_.resize(N * d.ffn_dim);
  mean_.resize(N);
  rstd_.resize(N);
  tok_.resize(N);
  rows_ = n;
}

// x'[i] = x[i] cos a - x[i+hs/2] sin a;  x'[i+hs/2] = x[i+hs/2] cos a + x[i] sin a, a = t f_i, for
// the heads [col0/hs, col0/hs + nheads) of each of the n rows, row i at position t = pos_ + i.
void Generator::rope_rows(float* qkv, int n, int nheads, int col0) const {
  const ModelDesc& d = m_.desc;
  const int hs = d.head_dim(), half = hs / 2, W = d.qkv_dim();
  for (int i = 0; i < n; i++) {
    const size_t t = static_cast<size_t>(pos_ + i);
    const float* ca = rope_cos_.data() + t * half;
    const float* sa = rope_sin_.data() + t * half;
    float* row = qkv + static_cast<size_t>(i) * W + col0;
    for (int h = 0; h < nheads; h++) {
      float* lo = row + static_cast<size_t>(h) * hs;
      float* hi = lo + half;
      for (int k = 0; k < half; k++) {
        const float a = lo[k], b = hi[k];
        lo[k] = a * ca[k] - b * sa[k];
        hi[k] = b * ca[k] + a * sa[k];
      }
    }
  }
}

// Store the n new rows' k and v in layer l's cache, then for each new row i (position p = pos_ + i)
// and query head h (kv head g = h / (NH/NKV)):
//   s_j = q_h(i) · K_g[j] / sqrt(hs), j = 0 .. p;   y_h(i) = Σ_j exp(s_j - max s) V_g[j] / Σ_j exp(s_j - max s)
void Generator::attend(int n, int l) {
  const ModelDesc& d = m_.desc;
  const int NH = d.n_head, NKV = d.n_kv_head, hs = d.head_dim(), W = d.qkv_dim(), AY = NH * hs;
  const int KV = NKV * hs, group = NH / NKV;
  float* K = kcache_[l].data();
  float* Vc = vcache_[l].data();
  for (int i = 0; i < n; i++) {
    const float* row = qkv_.data() + static_cast<size_t>(i) * W;
    std::copy(row + AY, row + AY + KV, K + static_cast<size_t>(pos_ + i) * KV);
    std::copy(row + AY + KV, row + AY + 2 * KV, Vc + static_cast<size_t>(pos_ + i) * KV);
  }
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const long long pairs = static_cast<long long>(n) * NH;
  const long long work = pairs * (pos_ + n) * hs;
#pragma omp parallel if (work > (1 << 15))
  {
    std::vector<float> s(static_cast<size_t>(pos_ + n));
#pragma omp for schedule(static)
    for (long long ph = 0; ph < pairs; ph++) {
      const int i = static_cast<int>(ph / NH), h = static_cast<int>(ph % NH), g = h / group;
      const int keys = pos_ + i + 1;
      const float* q = qkv_.data() + static_cast<size_t>(i) * W + static_cast<size_t>(h) * hs;
      float mx = -INFINITY;
      for (int j = 0; j < keys; j++) {
        const float* k = K + static_cast<size_t>(j) * KV + static_cast<size_t>(g) * hs;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < hs; c++) dot += q[c] * k[c];
        s[j] = dot * sc;
        mx = std::max(mx, s[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < keys; j++) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = 1.0f / sum;
      float* y = atty_.data() + static_cast<size_t>(i) * AY + static_cast<size_t>(h) * hs;
      std::fill(y, y + hs, 0.0f);
      for (int j = 0; j < keys; j++) {
        const float p = s[j] * inv;
        const float* v = Vc + static_cast<size_t>(j) * KV + static_cast<size_t>(g) * hs;
#pragma omp simd
        for (int c = 0; c < hs; c++) y[c] += p * v[c];
      }
    }
  }
}

namespace {

void norm_rows(const Ops& o, const ModelDesc& d, float* out, float* mean, float* rstd, const float* x,
               const float* w, const float* b, int N) {
  if (d.norm == NormKind::layernorm)
    o.layernorm_forward(out, mean, rstd, x, w, b, N, d.d_model, static_cast<float>(d.norm_eps), nullptr);
  else
    o.rmsnorm_forward(out, rstd, x, w, N, d.d_model, static_cast<float>(d.norm_eps), nullptr);
}

// out[N,OC] = inp[N,C] . weight[OC,C]^T + bias[OC]: the backend's matmul_forward, except for a
// single row (one new token), where it is a matrix-vector product: OpenBLAS's sgemm with M = 1
// runs ~2x slower than its sgemv here (0.3.21), and the whole weight matrix is read for one
// row, so this product bounds the speed of a token. The rows of W are cut into fixed blocks of
// kGemvBlock, one sgemv each (OpenMP over blocks, OpenBLAS held to one thread), so the result
// does not depend on the thread count.
constexpr int kGemvBlock = 512;

void dense(const Ops& o, float* out, const float* inp, const float* weight, const float* bias, int N, int C,
           int OC) {
  if (N != 1) return o.matmul_forward(out, inp, weight, bias, N, C, OC, GemmPrecision::fp32);  // sampling: fp32
  const int blocks = (OC + kGemvBlock - 1) / kGemvBlock;
  const bool par = blocks > 1 && 2.0 * C * OC > 1e6 && !omp_in_parallel();
  cpu::SerialBlas serial(par);
#pragma omp parallel for schedule(static) if (par)
  for (int b = 0; b < blocks; b++) {
    const int r0 = b * kGemvBlock, rows = std::min(kGemvBlock, OC - r0);
    float* y = out + r0;
    if (bias)
      std::copy(bias + r0, bias + r0 + rows, y);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, C, 1.0f, weight + static_cast<size_t>(r0) * C, C, inp, 1,
                bias ? 1.0f : 0.0f, y, 1);
  }
}

}  // namespace

void Generator::feed(const int32_t* tokens, int n, float* logits, bool all_logits) {
  if (n <= 0) fail("feed: no tokens given");
  if (pos_ + n > cap_)
    fail(pos_ + n, " positions do not fit the model's context of ", cap_,
         " positions; use a shorter prompt or fewer new tokens");
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V_)
      fail("token id ", tokens[i], " is outside the model's vocabulary [0, ", V_, ")");
  if (!kv_cache_) return feed_full(tokens, n, logits, all_logits);
  ensure_rows(n);
  const ModelDesc& d = m_.desc;
  const Ops& o = o_;
  const int C = d.d_model, NH = d.n_head, NKV = d.n_kv_head, hs = d.head_dim();
  const int QKV = d.qkv_dim(), F = d.ffn_dim, FC = d.fc_dim(), AY = NH * hs;
  const size_t NC = static_cast<size_t>(n) * C;
  std::copy(tokens, tokens + n, tok_.begin());
  float *x = x_.data(), *h = h_.data(), *tmp = tmp_.data();

  // Embedding: x = wte[tok] + wpe[pos_ + i] (positions only for learned-position models).
  const BlockTensors& pe = m_.pe;
  const float* wpe = d.learned_positions ? pe[kPosEmb] + static_cast<size_t>(pos_) * C : nullptr;
  o.embedding_forward(x, tok_.data(), pe[kTokEmb], wpe, 1, n, C);

  for (int l = 0; l < d.n_layer; l++) {
    const BlockTensors& w = m_.pb[l];
    // x = x + O attention(rope?(QKV N1(x)))
    norm_rows(o, d, h, mean_.data(), rstd_.data(), x, w[kNorm1W], w[kNorm1B], n);
    dense(o, qkv_.data(), h, w[kQkvW], w[kQkvB], n, C, QKV);
    if (!d.learned_positions) {
      rope_rows(qkv_.data(), n, NH, 0);
      rope_rows(qkv_.data(), n, NKV, AY);
    }
    attend(n, l);
    dense(o, tmp, atty_.data(), w[kAttnOutW], w[kAttnOutB], n, AY, C);
    o.residual_forward(x, x, tmp, NC);
    // x = x + P act(F N2(x))
    norm_rows(o, d, h, mean_.data(), rstd_.data(), x, w[kNorm2W], w[kNorm2B], n);
    dense(o, fc_.data(), h, w[kFcW], w[kFcB], n, C, FC);
    switch (d.mlp) {
      case MlpKind::gelu_tanh: o.gelu_forward(act_.data(), fc_.data(), static_cast<size_t>(n) * F); break;
      case MlpKind::gelu_erf: o.gelu_erf_forward(act_.data(), fc_.data(), static_cast<size_t>(n) * F, nullptr); break;
      case MlpKind::swiglu: o.swiglu_forward(act_.data(), fc_.data(), n, F, nullptr); break;
    }
    dense(o, tmp, act_.data(), w[kProjW], w[kProjB], n, F, C);
    o.residual_forward(x, x, tmp, NC);
  }

  // Head, on every fed row or only the last: logits = N_f(x) W^T.
  const int rows = all_logits ? n : 1;
  const float* xr = x + static_cast<size_t>(n - rows) * C;
  if (d.final_norm) {
    norm_rows(o, d, h, mean_.data(), rstd_.data(), xr, pe[kFinalNormW], pe[kFinalNormB], rows);
    xr = h;
  }
  const float* Wout = d.tie_embeddings ? pe[kTokEmb] : pe[kLmHead];
  dense(o, logits, xr, Wout, nullptr, rows, C, V_);
  pos_ += n;
}

// Without a cache: the full forward over every token fed so far, keeping the last n rows' logits.
void Generator::feed_full(const int32_t* tokens, int n, float* logits, bool all_logits) {
  history_.insert(history_.end(), tokens, tokens + n);
  const int T = static_cast<int>(history_.size());
  zeros_.assign(history_.size(), 0);
  if (!full_) {
    full_ = std::make_unique<Activations>();
    full_->all_logits = true;  // the last rows' logits are read below (no chunked LM head)
  }
  Batch b;
  b.B = 1;
  b.T = T;
  b.tokens = history_.data();
  b.targets = zeros_.data();
  m_.forward(*full_, b, HeadMode::eval);
  const int rows = all_logits ? n : 1;
  o_.copy_to_host(logits, full_->logits + static_cast<size_t>(T - rows) * V_,
                  static_cast<size_t>(rows) * V_ * sizeof(float));
  pos_ += n;
}

// ---- choosing the next token ------------------------------------------------------------------

void check_sampling_params(const SamplingParams& s) {
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
    fail("--temperature must be a finite number >= 0 (0 = greedy), got ", s.temperature);
  if (s.top_k < 0) fail("--top-k must be >= 0 (0 = no limit), got ", s.top_k);
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) fail("--top-p must be in (0, 1] (1 = no limit), got ", s.top_p);
}

int32_t choose_next_token(const float* logits, int V, const SamplingParams& s, Rng& rng) {
  if (V <= 0) fail("choose_next_token: empty vocabulary");
  // argmax, the lowest id among equal maxima
  int best = 0;
  for (int i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  if (s.greedy || s.temperature == 0.0f) return best;

  // p_i ∝ exp((l_i - l_max) / temperature), in double
  const double inv_t = 1.0 / static_cast<double>(s.temperature);
  const double lmax = logits[best];
  // Candidates in order of decreasing probability (ties: lower id first), cut to top_k.
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  auto more_likely = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int keep = V;
  if (s.top_k > 0 && s.top_k < V) {
    keep = s.top_k;
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), more_likely);
  } else if (s.top_p < 1.0f) {
    std::sort(ids.begin(), ids.end(), more_likely);
  }  // else: every id, in id order (no order is needed)
  std::vector<double> p(keep);
  double total = 0.0;
  for (int r = 0; r < keep; r++) {
    p[r] = std::exp((static_cast<double>(logits[ids[r]]) - lmax) * inv_t);
    total += p[r];
  }
  // top_p: the smallest prefix of the (sorted) candidates whose probability reaches top_p.
  if (s.top_p < 1.0f) {
    double cum = 0.0;
    int cut = keep;
    for (int r = 0; r < keep; r++) {
      cum += p[r];
      if (cum >= static_cast<double>(s.top_p) * total) {
        cut = r + 1;
        break;
      }
    }
    keep = cut;
    total = 0.0;
    for (int r = 0; r < keep; r++) total += p[r];
  }
  // One draw: the first candidate whose cumulative probability exceeds u · total.
  const double u = rng.uniform() * total;
  double cum = 0.0;
  for (int r = 0; r < keep; r++) {
    cum += p[r];
    if (u < cum) return ids[r];
  }
  return ids[keep - 1];
}

std::vector<int32_t> generate(Generator& g, const std::vector<int32_t>& prompt, int max_new,
                              const SamplingParams& s, Rng& rng, int choose_vocab, int32_t stop_id,
                              const std::function<void(int32_t)>& on_token) {
  check_sampling_params(s);
  if (prompt.empty()) fail("the prompt has no tokens; give at least one");
  const int n = static_cast<int>(prompt.size());
  if (n >= g.capacity())
    fail("the prompt has ", n, " tokens but the model's context is ", g.capacity(),
         " positions, which leaves no room for a new token; shorten the prompt");
  if (choose_vocab <= 0 || choose_vocab > g.vocab_size()) choose_vocab = g.vocab_size();
  g.reset();
  std::vector<float> logits(static_cast<size_t>(g.vocab_size()));
  std::vector<int32_t> out;
  g.feed(prompt.data(), n, logits.data());
  while (static_cast<int>(out.size()) < max_new) {
    size_t first = 0;
    const size_t bad = count_nonfinite(logits.data(), logits.size(), &first);
    if (bad)
      fail("the logits for new token ", out.size() + 1, " (position ", n + out.size(), ") are not finite: ", bad,
           " of ", logits.size(), " (the first, ", value_name(logits[first]), ", at id ", first,
           "); the weights are finite, so the forward pass overflows on this sequence. The model is not usable "
           "as it is (a diverged run?): use an earlier checkpoint");
    const int32_t id = choose_next_token(logits.data(), choose_vocab, s, rng);
    out.push_back(id);
    if (on_token) on_token(id);
    if (id == stop_id) break;
    if (static_cast<int>(out.size()) >= max_new || n + static_cast<int>(out.size()) >= g.capacity()) break;
    g.feed(&id, 1, logits.data());
  }
  return out;
}

}  // namespace llmpi
