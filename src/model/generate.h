// Text generation for the causal language-model families (gpt2, llama): an incremental forward
// with a key/value cache, and the choice of the next token (greedy, temperature, top-k, top-p).
//
// The incremental forward runs the same stack as Model::forward (model/transformer.h), on the
// same parameter table and the same backend ops, but only for the NEW positions:
//
//   feed(tokens[0..n), at positions p0 .. p0+n-1, p0 = tokens fed before):
//     x      = wte[tok] + [wpe[p0 + i]]                     (learned positions: gpt2)
//     block  h = N1(x); [q|k|v] = QKV h; rope?(q, k) at the absolute positions p0 + i (llama)
//            K[l][p0+i] = k, V[l][p0+i] = v                  (the cache: every position fed so far)
//            y_h(i) = Σ_{j <= p0+i} softmax_j(q_h(i) · K_g[j] / sqrt(hs)) V_g[j],
//                   g = h / (NH/NKV) (grouped K/V heads: a query head reads its group's cache)
//            x = x + O y;  x = x + P act(F N2(x))
//     logits = N_f(x) · W^T (W = wte when tied, else lm_head)
//
// so a new token costs one position: its own projections plus attention over the cache, instead
// of a forward over the whole sequence. Feeding a prompt of n tokens at once (prefill) does the
// same work as a forward of those n tokens. At every position the logits equal the full
// forward's to float rounding (tests/test_generate.cpp).
//
// CPU only: the cache, the rotary embedding at an offset and the attention over the cache are
// host loops here, and a single row's dense layers are OpenBLAS sgemv calls (one token reads
// every weight once: a matrix-vector product); the rest (dense layers over several rows, norms,
// activations, embeddings) are the backend's ops, called through the Model's Ops table, which
// must be the CPU backend's. Not thread-safe: one Generator per thread.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "runtime/rng.h"

namespace llmpi {

// "" when every value of the table's tensors in params (host, table layout) is finite; else the
// first tensor that is not, e.g. "tensor 'h.0.attn.c_attn.weight' holds 3 non-finite values of
// 12288 (the first, nan, at element 17)".
std::string nonfinite_tensor(const ParamTable& t, const float* params);
// The same for one tensor, its s.numel values at `values`.
std::string nonfinite_slice(const ParamSlice& s, const float* values);

// Why a model cannot generate ("" when it can): a classifier head (bert), bidirectional
// attention, a part of the stack rather than the whole model, or a non-CPU backend.
std::string generation_unsupported_reason(const Model& m);

struct Generator {
  // capacity: the most positions the cache holds (0 = the model's max_seq_len; never more than
  // that, since learned positions stop there). Throws Error when the model cannot generate or
  // a weight is not finite (naming the tensor: nonfinite_tensor).
  // kv_cache = false keeps only the token history and runs the full forward (Model::forward)
  // over all of it on every feed: the same logits at quadratic cost (the baseline of
  // bench-sample_gpt2 and llmpi-sample --no-kv-cache).
  explicit Generator(const Model& m, int capacity = 0, bool kv_cache = true);

  int position() const { return pos_; }   // positions fed so far
  int capacity() const { return cap_; }
  int vocab_size() const { return V_; }
  bool kv_cache() const { return kv_cache_; }
  void reset() { pos_ = 0; history_.clear(); }  // forget the cache (the next feed starts at position 0)

  // Feed n >= 1 tokens at positions [position(), position() + n). Writes the logits of every fed
  // position to logits [n, V] when all_logits, else only those of the last one [V]. Throws Error
  // when a token is outside [0, V) or the cache would overflow (position() + n > capacity()).
  void feed(const int32_t* tokens, int n, float* logits, bool all_logits = false);

 private:
  const Model& m_;
  const Ops& o_;
  int cap_ = 0, pos_ = 0, V_ = 0;
  bool kv_cache_ = true;
  std::vector<int32_t> history_, zeros_;  // kv_cache = false: every token fed, and dummy targets
  std::unique_ptr<Activations> full_;     // kv_cache = false: the full forward's activations
  std::vector<std::vector<float>> kcache_, vcache_;  // per layer: [cap, NKV*hs]
  std::vector<float> rope_cos_, rope_sin_;           // [cap, hs/2] (RoPE models)
  // Per-chunk buffers, grown to the largest chunk fed.
  int rows_ = 0;
  std::vector<float> x_, h_, qkv_, atty_, tmp_, fc_, act_, mean_, rstd_, logits_;
  std::vector<int32_t> tok_;
  void ensure_rows(int n);
  void rope_rows(float* qkv, int n, int nheads, int col0) const;
  void attend(int n, int layer);
  void feed_full(const int32_t* tokens, int n, float* logits, bool all_logits);
};

// How the next token is chosen from the logits of the last position.
//   greedy (or temperature == 0): the argmax (the lowest id among equal maxima, as torch.argmax)
//   otherwise: p = softmax(logits / temperature), restricted to the top_k most likely ids (0 =
//   all) and then to the smallest set of most likely ids whose probability sums to >= top_p
//   (1 = all; at least one id is kept), renormalised, and one id drawn with the Rng.
// top_k = 1 therefore picks the argmax whatever the temperature and the draw.
struct SamplingParams {
  bool greedy = false;
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
};

// Throws Error naming the flag for values out of range (temperature < 0, top_k < 0, top_p outside
// (0, 1]).
void check_sampling_params(const SamplingParams& s);

// The next token among ids [0, V) (V may be less than the model's vocabulary, e.g. the
// tokenizer's). Consumes exactly one draw from rng unless the choice is greedy.
int32_t choose_next_token(const float* logits, int V, const SamplingParams& s, Rng& rng);

// Feeds the prompt (>= 1 token) into a fresh generator, then repeatedly chooses the next token
// among ids [0, choose_vocab) from the last position's logits and feeds it, calling on_token(id)
// as soon as each is chosen. Stops after max_new tokens, after emitting stop_id (when >= 0; the
// stop token is returned and reported too), or when the sequence (prompt + new tokens) fills the
// generator's capacity. Returns the new tokens. Throws Error when the prompt does not leave room
// for one new token, or when the logits of a step are not all finite (naming the step and the
// position; no token is chosen from them).
std::vector<int32_t> generate(Generator& g, const std::vector<int32_t>& prompt, int max_new,
                              const SamplingParams& s, Rng& rng, int choose_vocab, int32_t stop_id,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace llmpi
