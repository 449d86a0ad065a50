#include "model/model_desc.h"

#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/families/families.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace llmpi {

const std::vector<std::string>& family_names() {
  static const std::vector<std::string> n = {option_name(Family::gpt2), option_name(Family::llama),
                                             option_name(Family::bert)};
  return n;
}

const char* family_name(Family f) { return option_name(f); }

Family parse_family(const std::string& name) {
  Family f{};
  if (!parse_option(name, &f)) fail("unknown model family \"", name, "\": use ", option_words<Family>());
  return f;
}

const char* role_name(int role) {
  static const char* const names[kRoleCount] = {
      "tok_emb", "pos_emb", "type_emb", "emb_norm.weight", "emb_norm.bias", "norm1.weight", "norm1.bias",
      "qkv.weight", "qkv.bias", "attn_out.weight", "attn_out.bias", "norm2.weight", "norm2.bias", "fc.weight",
      "fc.bias", "proj.weight", "proj.bias", "final_norm.weight", "final_norm.bias", "lm_head", "pooler.weight",
      "pooler.bias", "classifier.weight", "classifier.bias"};
  return role >= 0 && role < kRoleCount ? names[role] : "?";
}

std::vector<std::string> family_tensor_names(Family f, int role, int layer) {
  switch (f) {
    case Family::gpt2: return gpt2_tensor_names(role, layer);
    case Family::llama: return llama_tensor_names(role, layer);
    case Family::bert: return bert_tensor_names(role, layer);
  }
  return {};
}

AttentionImpl resolve_attention(AttentionChoice setting, bool on_gpu, int head_dim) {
  const bool kernels_take_it = head_dim <= kFusedAttentionMaxHeadDimCuda;
  switch (setting) {
    case AttentionChoice::full: return AttentionImpl::full;
    case AttentionChoice::fused:
      if (on_gpu && !kernels_take_it)
        fail("runtime.attention \"fused\": the CUDA kernels take head sizes up to ", kFusedAttentionMaxHeadDimCuda,
             ", but model.d_model / model.n_head is ", head_dim, ": set runtime.attention \"full\" (or \"auto\")");
      return AttentionImpl::fused;
    case AttentionChoice::automatic: break;
  }
  return on_gpu && kernels_take_it ? AttentionImpl::fused : AttentionImpl::full;
}

AttentionImpl resolve_attention(const std::string& setting, bool on_gpu, int head_dim) {
  AttentionChoice c{};
  if (!parse_option(setting, &c))
    fail("runtime.attention must be ", option_words<AttentionChoice>(), ", got \"", setting, "\"");
  return resolve_attention(c, on_gpu, head_dim);
}

const char* attention_impl_name(AttentionImpl a) { return a == AttentionImpl::fused ? "fused" : "full"; }

namespace {

// (printed with its digits grouped: 2147483647 -> "2,147,483,647")
std::string grouped(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string approx(__int128 v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", static_cast<double>(v));
  return buf;
}

constexpr int64_t kMaxWidth = std::numeric_limits<int>::max();

}  // namespace

int family_ffn_dim(int64_t width, const char* rule, int d_model) {
  if (width > kMaxWidth)
    fail("config: 'model.d_model' ", grouped(d_model), " makes the MLP ", grouped(width), " wide (", rule,
         "), more than ", grouped(kMaxWidth), ", the largest width the kernels take (an int): choose a smaller "
         "model.d_model, or set model.ffn_dim");
  return static_cast<int>(width);
}

void check_model_sizes(const ModelDesc& d) {
  if (d.n_layer > kMaxLayers)
    fail("config: 'model.n_layer' ", grouped(d.n_layer), " is more than ", grouped(kMaxLayers),
         ", the most transformer blocks a model may have (the deepest models trained have a few hundred): choose "
         "fewer layers");
  const int64_t C = d.d_model, hs = d.n_head > 0 ? C / d.n_head : 0, F = d.ffn_dim;
  const int64_t qd = int64_t(d.n_head) * hs, kvd = int64_t(d.n_kv_head) * hs, qkv = qd + 2 * kvd;
  if (qkv > kMaxWidth)
    fail("config: 'model.d_model' ", grouped(d.d_model), " makes the QKV projection ", grouped(qkv),
         " wide ((n_head + 2 x n_kv_head) x d_model / n_head), more than ", grouped(kMaxWidth),
         ", the largest width the kernels take (an int): choose a smaller model.d_model");
  const int64_t fc = d.mlp == MlpKind::swiglu ? 2 * F : F;
  if (fc > kMaxWidth)
    fail("config: 'model.ffn_dim' ", grouped(F), " makes the MLP's first projection ", grouped(fc),
         " wide (gate and up: 2 x ffn_dim), more than ", grouped(kMaxWidth),
         ", the largest width the kernels take (an int): choose a smaller model.ffn_dim (or model.d_model, whose "
         "multiple it is by default)");
  const int64_t ld = (int64_t(d.vocab_size) + 63) / 64 * 64;  // lm_logits_row_stride, in 64 bits
  if (d.head == HeadKind::lm && ld > kMaxWidth)
    fail("config: 'model.vocab_size' ", grouped(d.vocab_size), " pads the LM head's rows of logits to ", grouped(ld),
         " values, more than ", grouped(kMaxWidth), ", the largest width the kernels take (an int): choose a "
         "vocabulary of at most ", grouped(kMaxWidth / 64 * 64), " tokens");
  // The whole model's parameters, from the shapes build_param_table gives (products of ints: exact
  // in 128 bits).
  using Wide = __int128;
  const Wide norm = d.norm == NormKind::layernorm ? 2 * C : C;  // weight (and bias)
  const Wide attn = Wide(C) * qd + Wide(qkv) * C + (d.bias ? C + qkv : 0);
  const Wide mlp = Wide(C) * F + Wide(fc) * C + (d.bias ? C + fc : 0);
  const Wide block = 2 * norm + attn + mlp;
  Wide outer = Wide(d.vocab_size) * C;  // the token embedding
  if (d.learned_positions) outer += Wide(d.max_seq_len) * C;
  if (d.type_vocab_size > 0) outer += Wide(d.type_vocab_size) * C;
  if (d.embedding_norm) outer += 2 * C;
  if (d.head == HeadKind::lm) {
    if (!d.tie_embeddings) outer += Wide(d.vocab_size) * C;
    if (d.final_norm) outer += norm;
  } else {
    outer += Wide(d.num_labels) * C + d.num_labels + Wide(C) * C + C;
  }
  const Wide total = Wide(d.n_layer) * block + outer;
  if (total > kMaxParams)
    fail("config: the model has about ", approx(total), " parameters (model.n_layer ", d.n_layer, " blocks of ",
         approx(block), ", and ", approx(outer), " in the embeddings and the head), more than ", approx(kMaxParams),
         " (2^56), the most whose byte counts 64-bit sizes hold: choose a smaller model.d_model, model.ffn_dim, "
         "model.n_layer or model.vocab_size");
}

ModelDesc model_desc_from_config(const ModelConfig& m, int vocab_size) {
  ModelDesc d;
  switch (m.family) {
    case Family::gpt2: d = gpt2_desc(m); break;
    case Family::llama: d = llama_desc(m); break;
    case Family::bert: d = bert_desc(m); break;
  }
  d.n_layer = m.n_layer;
  d.n_head = m.n_head;
  d.n_kv_head = d.family == Family::llama && m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  d.d_model = m.d_model;
  d.max_seq_len = m.max_seq_len > 0 ? m.max_seq_len : m.seq_len;
  d.vocab_size = vocab_size;
  d.norm_eps = m.norm_eps;
  d.init_std = m.init_std;
  if (d.n_head % d.n_kv_head != 0)
    fail("config: 'model.n_kv_head' (", d.n_kv_head, ") must divide 'model.n_head' (", d.n_head,
         "): every key/value head serves the same number of query heads");
  if (!d.learned_positions && d.head_dim() % 2 != 0)
    fail("config: rotary positions need an even head size, but d_model / n_head = ", d.head_dim(),
         ": choose model.d_model and model.n_head so their quotient is even");
  if (d.max_seq_len < m.seq_len)
    fail("config: 'model.max_seq_len' (", d.max_seq_len, ") is shorter than 'model.seq_len' (", m.seq_len,
         "): set it >= seq_len, or 0 to use seq_len");
  check_model_sizes(d);
  return d;
}

ModelDesc tensor_shard(const ModelDesc& d, int tp, int rank) {
  if (d.tp != 1) fail("internal: tensor_shard of a description that is a shard already");
  if (tp < 1 || rank < 0 || rank >= tp) fail("internal: tensor shard ", rank, " of ", tp);
  if (d.n_head % tp != 0)
    fail("parallel.tp ", tp, " does not divide model.n_head ", d.n_head,
         ": each rank holds whole attention heads; choose parallel.tp dividing ", d.n_head);
  if (d.n_kv_head % tp != 0)
    fail("parallel.tp ", tp, " does not divide the ", d.n_kv_head, " key/value heads (model.n_kv_head): each rank "
         "holds whole key/value heads (they are not replicated); choose parallel.tp dividing ", d.n_kv_head,
         " or raise model.n_kv_head");
  if (d.ffn_dim % tp != 0)
    fail("parallel.tp ", tp, " does not divide the MLP width ", d.ffn_dim,
         " (model.ffn_dim): choose parallel.tp dividing it, or set model.ffn_dim to a multiple of ", tp);
  if (d.vocab_size < tp)
    fail("parallel.tp ", tp, " is larger than the vocabulary (", d.vocab_size, " tokens)");
  ModelDesc s = d;
  s.tp = tp;
  s.tp_rank = rank;
  return s;
}

nlohmann::json model_desc_json(const ModelDesc& d) {
  return {{"family", family_name(d.family)},
          {"n_layer", d.n_layer},
          {"n_head", d.n_head},
          {"n_kv_head", d.n_kv_head},
          {"d_model", d.d_model},
          {"ffn_dim", d.ffn_dim},
          {"max_seq_len", d.max_seq_len},
          {"vocab_size", d.vocab_size},
          {"norm", d.norm == NormKind::layernorm ? "layernorm" : "rmsnorm"},
          {"norm_eps", d.norm_eps},
          {"pre_norm", d.pre_norm},
          {"learned_positions", d.learned_positions},
          {"rope_theta", d.rope_theta},
          {"type_vocab_size", d.type_vocab_size},
          {"embedding_norm", d.embedding_norm},
          {"mlp", d.mlp == MlpKind::gelu_tanh ? "gelu_tanh" : d.mlp == MlpKind::gelu_erf ? "gelu_erf" : "swiglu"},
          {"bias", d.bias},
          {"causal", d.causal},
          {"head", d.head == HeadKind::lm ? "lm" : "classifier"},
          {"tie_embeddings", d.tie_embeddings},
          {"final_norm", d.final_norm},
          {"num_labels", d.num_labels},
          {"residual_scaled_init", d.residual_scaled_init},
          {"init_std", d.init_std},
          {"dropout", d.dropout},
          {"attn_dropout", d.attn_dropout}};
}

ModelDesc model_desc_from_json(const nlohmann::json& j) {
  try {
    ModelDesc d;
    d.family = parse_family(j.at("family").get<std::string>());
    d.n_layer = j.at("n_layer");
    d.n_head = j.at("n_head");
    d.n_kv_head = j.at("n_kv_head");
    d.d_model = j.at("d_model");
    d.ffn_dim = j.at("ffn_dim");
    d.max_seq_len = j.at("max_seq_len");
    d.vocab_size = j.at("vocab_size");
    d.norm = j.at("norm") == "layernorm" ? NormKind::layernorm : NormKind::rmsnorm;
    d.norm_eps = j.at("norm_eps");
    d.pre_norm = j.at("pre_norm");
    d.learned_positions = j.at("learned_positions");
    d.rope_theta = j.at("rope_theta");
    d.type_vocab_size = j.at("type_vocab_size");
    d.embedding_norm = j.at("embedding_norm");
    const std::string mlp = j.at("mlp");
    d.mlp = mlp == "gelu_tanh" ? MlpKind::gelu_tanh : mlp == "gelu_erf" ? MlpKind::gelu_erf : MlpKind::swiglu;
    d.bias = j.at("bias");
    d.causal = j.at("causal");
    d.head = j.at("head") == "lm" ? HeadKind::lm : HeadKind::classifier;
    d.tie_embeddings = j.at("tie_embeddings");
    d.final_norm = j.at("final_norm");
    d.num_labels = j.at("num_labels");
    d.residual_scaled_init = j.at("residual_scaled_init");
    d.init_std = j.at("init_std");
    d.dropout = j.at("dropout");
    d.attn_dropout = j.at("attn_dropout");
    check_model_sizes(d);
    return d;
  } catch (const nlohmann::json::exception& e) {
    fail("malformed model description: ", e.what());
  }
}

double flops_per_token(const ModelDesc& d, size_t n_params, int seq_len) {
  return 6.0 * static_cast<double>(n_params) + 12.0 * d.n_layer * static_cast<double>(seq_len) * d.d_model;
}

}  // namespace llmpi
