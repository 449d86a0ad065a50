#include "model/gpt2.h"

#include <cmath>

#include "runtime/error.h"
#include "runtime/rng.h"

namespace llmpi {

const ParamSlice& ParamTable::at(const std::string& name) const {
  for (auto& s : slices)
    if (s.name == name) return s;
  fail("no parameter named '", name, "' in the model");
}

ParamTable gpt2_param_table(const ModelShape& s) {
  const int C = s.d_model, V = s.vocab_size, L = s.n_layer;
  ParamTable t;
  auto add = [&](std::string name, std::vector<int> shape, bool decay) {
    size_t n = 1;
    for (int d : shape) n *= (size_t)d;
    t.slices.push_back({std::move(name), std::move(shape), t.numel, n, decay});
    t.numel += n;
  };
  // Backward-completion order (see gpt2.h).
  add("ln_f.weight", {C}, false);
  add("ln_f.bias", {C}, false);
  for (int l = L - 1; l >= 0; l--) {
    std::string h = "h." + std::to_string(l) + ".";
    add(h + "mlp.c_proj.weight", {C, 4 * C}, true);
    add(h + "mlp.c_proj.bias", {C}, false);
    add(h + "mlp.c_fc.weight", {4 * C, C}, true);
    add(h + "mlp.c_fc.bias", {4 * C}, false);
    add(h + "ln_2.weight", {C}, false);
    add(h + "ln_2.bias", {C}, false);
    add(h + "attn.c_proj.weight", {C, C}, true);
    add(h + "attn.c_proj.bias", {C}, false);
    add(h + "attn.c_attn.weight", {3 * C, C}, true);
    add(h + "attn.c_attn.bias", {3 * C}, false);
    add(h + "ln_1.weight", {C}, false);
    add(h + "ln_1.bias", {C}, false);
  }
  add("wpe.weight", {s.max_seq_len, C}, true);
  add("wte.weight", {V, C}, true);
  return t;
}

double gpt2_flops_per_token(const ModelShape& s, int seq_len) {
  double n = (double)gpt2_param_table(s).numel;
  return 6.0 * n + 12.0 * s.n_layer * (double)seq_len * s.d_model;
}

static ModelTensors bind(const ParamTable& t, float* base, int L) {
  auto at = [&](const std::string& n) { return base + t.at(n).offset; };
  ModelTensors m;
  m.wte = at("wte.weight");
  m.wpe = at("wpe.weight");
  m.lnfw = at("ln_f.weight");
  m.lnfb = at("ln_f.bias");
  for (int l = 0; l < L; l++) {
    std::string h = "h." + std::to_string(l) + ".";
    m.layers.push_back({at(h + "ln_1.weight"), at(h + "ln_1.bias"), at(h + "attn.c_attn.weight"),
                        at(h + "attn.c_attn.bias"), at(h + "attn.c_proj.weight"), at(h + "attn.c_proj.bias"),
                        at(h + "ln_2.weight"), at(h + "ln_2.bias"), at(h + "mlp.c_fc.weight"),
                        at(h + "mlp.c_fc.bias"), at(h + "mlp.c_proj.weight"), at(h + "mlp.c_proj.bias")});
  }
  return m;
}

Gpt2::Gpt2(const ModelShape& s, const Ops& o) : shape(s), ops(&o), table(gpt2_param_table(s)) {
  params = (float*)ops->alloc(table.numel * sizeof(float));
  grads = (float*)ops->alloc(table.numel * sizeof(float));
  p = bind(table, params, s.n_layer);
  g = bind(table, grads, s.n_layer);
  // Each group's slices end where the next group's begin (layout order = backward order).
  for (int l = 0; l < s.n_layer; l++) {
    std::string h = "h." + std::to_string(l) + ".";
    auto end_of = [&](const std::string& n) { return table.at(h + n).offset + table.at(h + n).numel; };
    ready_.push_back({end_of("mlp.c_proj.bias"), end_of("mlp.c_fc.bias"), end_of("ln_2.bias"),
                      end_of("attn.c_proj.bias"), end_of("attn.c_attn.bias"), end_of("ln_1.bias")});
  }
}

Gpt2::~Gpt2() {
  ops->free(params);
  ops->free(grads);
  ops->free(act_);
  ops->free(tokens_);
}

void Gpt2::init_params(uint64_t seed, double std) {
  std::vector<float> host(table.numel);
  const double proj_std = std / std::sqrt(2.0 * shape.n_layer);
  for (size_t i = 0; i < table.slices.size(); i++) {
    const ParamSlice& sl = table.slices[i];
    float* w = host.data() + sl.offset;
    bool is_bias = sl.name.size() > 5 && sl.name.compare(sl.name.size() - 5, 5, ".bias") == 0;
    bool is_ln = sl.name.find("ln_") != std::string::npos;
    if (is_bias) {
      for (size_t k = 0; k < sl.numel; k++) w[k] = 0.0f;
    } else if (is_ln) {
      for (size_t k = 0; k < sl.numel; k++) w[k] = 1.0f;
    } else {
      bool residual_proj = sl.name.find("c_proj.weight") != std::string::npos;
      double sd = residual_proj ? proj_std : std;
      Rng rng(seed, 1000 + i);  // one stream per tensor: independent of layout changes elsewhere
      for (size_t k = 0; k < sl.numel; k++) w[k] = (float)(sd * rng.normal());
    }
  }
  ops->copy_to_device(params, host.data(), host.size() * sizeof(float));
}

void Gpt2::zero_grads() { ops->zero(grads, table.numel * sizeof(float)); }

void Gpt2::ensure_activations(int B, int T) {
  if (T > shape.max_seq_len)
    fail("sequence length ", T, " exceeds the model's max_seq_len ", shape.max_seq_len);
  if (B == B_ && T == T_) return;
  ops->free(act_);
  ops->free(tokens_);
  const size_t C = shape.d_model, V = shape.vocab_size, NH = shape.n_head, N = (size_t)B * T;
  // Lay out every activation in one allocation: first count, then hand out pointers.
  std::vector<std::pair<float**, size_t>> plan;
  la_.assign(shape.n_layer, {});
  for (auto& a : la_) {
    plan.insert(plan.end(), {{&a.ln1, N * C}, {&a.ln1_mean, N}, {&a.ln1_rstd, N}, {&a.qkv, N * 3 * C},
                             {&a.atty, N * C}, {&a.att, (size_t)B * NH * T * T}, {&a.res2, N * C},
                             {&a.ln2, N * C}, {&a.ln2_mean, N}, {&a.ln2_rstd, N}, {&a.fch, N * 4 * C},
                             {&a.fch_gelu, N * 4 * C}, {&a.res3, N * C}});
  }
  plan.insert(plan.end(), {{&encoded_, N * C}, {&lnf_, N * C}, {&lnf_mean_, N}, {&lnf_rstd_, N},
                           {&logits_, N * V}, {&losses_, N}, {&proj_, N * C}, {&dresidual_, N * C},
                           {&dln_, N * C}, {&datty_, N * C}, {&dqkv_, N * 3 * C}, {&dfch_, N * 4 * C},
                           {&dfch_gelu_, N * 4 * C}, {&datt_scratch_, (size_t)B * NH * T * T}});
  size_t total = 0;
  for (auto& [ptr, n] : plan) total += (n + 15) / 16 * 16;  // keep every tensor 64-byte aligned
  act_ = (float*)ops->alloc(total * sizeof(float));
  size_t off = 0;
  for (auto& [ptr, n] : plan) {
    *ptr = act_ + off;
    off += (n + 15) / 16 * 16;
  }
  act_floats_ = total;
  tokens_ = (int32_t*)ops->alloc(2 * N * sizeof(int32_t));
  losses_host_.resize(N);
  B_ = B;
  T_ = T;
}

float Gpt2::forward(const int32_t* inputs, const int32_t* targets, int B, int T, bool need_grad,
                    float grad_scale) {
  ensure_activations(B, T);
  const Ops& o = *ops;
  const int C = shape.d_model, NH = shape.n_head, V = shape.vocab_size, N = B * T;
  o.copy_to_device(tokens_, inputs, (size_t)N * sizeof(int32_t));
  o.copy_to_device(tokens_ + N, targets, (size_t)N * sizeof(int32_t));

  o.embedding_forward(encoded_, tokens_, p.wte, p.wpe, B, T, C);
  const float* x = encoded_;
  for (int l = 0; l < shape.n_layer; l++) {
    const LayerTensors& w = p.layers[l];
    LayerActs& a = la_[l];
    o.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, N, C);
    o.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * C);
    o.attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
    o.matmul_forward(proj_, a.atty, w.attprojw, w.attprojb, N, C, C);
    o.residual_forward(a.res2, x, proj_, (size_t)N * C);
    o.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, N, C);
    o.matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, N, C, 4 * C);
    o.gelu_forward(a.fch_gelu, a.fch, (size_t)N * 4 * C);
    o.matmul_forward(proj_, a.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);
    o.residual_forward(a.res3, a.res2, proj_, (size_t)N * C);
    x = a.res3;
  }
  o.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, p.lnfw, p.lnfb, N, C);
  o.matmul_forward(logits_, lnf_, p.wte, nullptr, N, C, V);
  o.softmax_xent(logits_, losses_, tokens_ + N, N, V, need_grad ? grad_scale / (float)N : 0.0f);

  o.copy_to_host(losses_host_.data(), losses_, (size_t)N * sizeof(float));
  double sum = 0;
  for (int i = 0; i < N; i++) sum += losses_host_[i];
  return (float)(sum / N);
}

void Gpt2::backward(const std::function<void(size_t)>& grads_ready) {
  const Ops& o = *ops;
  const int B = B_, T = T_, C = shape.d_model, NH = shape.n_head, V = shape.vocab_size, N = B * T;
  const size_t NC = (size_t)N * C;
  auto ready = [&](size_t k) {
    if (grads_ready) grads_ready(k);
  };
  // logits_ already holds d(loss)/d(logits) (see forward).
  o.zero(dln_, NC * sizeof(float));
  o.matmul_backward(dln_, g.wte, nullptr, logits_, lnf_, p.wte, N, C, V);
  o.zero(dresidual_, NC * sizeof(float));
  const float* x_last = shape.n_layer > 0 ? la_.back().res3 : encoded_;
  o.layernorm_backward(dresidual_, g.lnfw, g.lnfb, dln_, x_last, p.lnfw, lnf_mean_, lnf_rstd_, N, C);
  ready(table.at("ln_f.bias").offset + C);

  for (int l = shape.n_layer - 1; l >= 0; l--) {
    const LayerTensors& w = p.layers[l];
    const LayerTensors& dw = g.layers[l];
    const LayerActs& a = la_[l];
    const float* x_in = l == 0 ? encoded_ : la_[l - 1].res3;
    // dresidual holds d(res3). MLP branch: res3 = res2 + fc_proj(gelu(fc(LN2(res2)))).
    o.zero(dfch_gelu_, 4 * NC * sizeof(float));
    o.matmul_backward(dfch_gelu_, dw.fcprojw, dw.fcprojb, dresidual_, a.fch_gelu, w.fcprojw, N, 4 * C, C);
    ready(ready_[l][0]);
    o.zero(dfch_, 4 * NC * sizeof(float));
    o.gelu_backward(dfch_, a.fch, dfch_gelu_, 4 * NC);
    o.zero(dln_, NC * sizeof(float));
    o.matmul_backward(dln_, dw.fcw, dw.fcb, dfch_, a.ln2, w.fcw, N, C, 4 * C);
    ready(ready_[l][1]);
    o.layernorm_backward(dresidual_, dw.ln2w, dw.ln2b, dln_, a.res2, w.ln2w, a.ln2_mean, a.ln2_rstd, N, C);
    ready(ready_[l][2]);
    // dresidual now holds d(res2). Attention branch: res2 = x + attn_proj(attention(qkv(LN1(x)))).
    o.zero(datty_, NC * sizeof(float));
    o.matmul_backward(datty_, dw.attprojw, dw.attprojb, dresidual_, a.atty, w.attprojw, N, C, C);
    ready(ready_[l][3]);
    o.zero(dqkv_, 3 * NC * sizeof(float));
    o.attention_backward(dqkv_, datt_scratch_, datty_, a.qkv, a.att, B, T, C, NH);
    o.zero(dln_, NC * sizeof(float));
    o.matmul_backward(dln_, dw.qkvw, dw.qkvb, dqkv_, a.ln1, w.qkvw, N, C, 3 * C);
    ready(ready_[l][4]);
    o.layernorm_backward(dresidual_, dw.ln1w, dw.ln1b, dln_, x_in, w.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
    // dresidual now holds d(x), the gradient at this layer's input.
    ready(ready_[l][5]);
  }
  o.embedding_backward(g.wte, g.wpe, dresidual_, tokens_, B, T, C);
  ready(table.numel);
}

}  // namespace llmpi
