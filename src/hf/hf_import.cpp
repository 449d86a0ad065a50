#include "hf/hf_import.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "hf/export_dir.h"
#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

using nlohmann::json;

namespace {

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

json read_json_file(const std::string& path, const std::string& fix) {
  std::ifstream in(path);
  if (!in) fail("cannot read '", path, "'", fix);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail("'", path, "' is not a JSON object; is it a Hugging Face file?");
  return j;
}

// config.json reading: a value of the expected kind or the Hugging Face default when absent/null.
struct ConfigReader {
  const json& j;
  std::string path;
  int integer(const char* key, int def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
      fail("'", path, "': \"", key, "\" must be a non-negative integer, got ", v.dump());
    return v.get<int>();
  }
  double number(const char* key, double def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_number()) fail("'", path, "': \"", key, "\" must be a number, got ", j[key].dump());
    return j[key].get<double>();
  }
  bool boolean(const char* key, bool def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_boolean()) fail("'", path, "': \"", key, "\" must be true or false, got ", j[key].dump());
    return j[key].get<bool>();
  }
  std::string string(const char* key, const std::string& def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_string()) fail("'", path, "': \"", key, "\" must be a string, got ", j[key].dump());
    return j[key].get<std::string>();
  }
  // A setting our family cannot compute.
  [[noreturn]] void unsupported(const char* key, const std::string& why) const {
    fail("'", path, "': \"", key, "\" = ", j.contains(key) ? j[key].dump() : std::string("(default)"), " is not supported: ",
         why);
  }
};

// Names our table uses → names in this checkpoint, decided by which form the files use.
struct NameMap {
  Family family = Family::gpt2;
  std::string gpt2_prefix;     // "transformer." (GPT2LMHeadModel) or ""
  bool bert_prefixed = true;   // "bert.embeddings..." (BertFor*) or "embeddings..." (BertModel)
  bool llama_prefixed = true;  // "model.layers..." (LlamaForCausalLM) or "layers..." (LlamaModel)

  std::string operator()(const std::string& ours) const {
    switch (family) {
      case Family::gpt2: return ours == "lm_head.weight" ? ours : gpt2_prefix + ours;
      case Family::bert: return !bert_prefixed && ours.rfind("bert.", 0) == 0 ? ours.substr(5) : ours;
      case Family::llama: return !llama_prefixed && ours.rfind("model.", 0) == 0 ? ours.substr(6) : ours;
    }
    return ours;
  }
};

NameMap name_map(Family f, const HfWeights& w) {
  NameMap m;
  m.family = f;
  m.gpt2_prefix = w.find("transformer.wte.weight") ? "transformer." : "";
  m.bert_prefixed = w.find("bert.embeddings.word_embeddings.weight") != nullptr;
  m.llama_prefixed = w.find("model.embed_tokens.weight") != nullptr || !w.find("embed_tokens.weight");
  return m;
}

// Buffers some checkpoints carry that are not parameters.
bool is_known_buffer(const std::string& n) {
  auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
  return ends("attn.bias") || ends("attn.masked_bias") || ends("rotary_emb.inv_freq") ||
         ends("embeddings.position_ids");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string name_list(const std::vector<std::string>& names, size_t max = 8) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; i++) s += (i ? ", " : "") + names[i];
  if (names.size() > max) s += ", ... (" + std::to_string(names.size() - max) + " more)";
  return s;
}

}  // namespace

bool hf_is_conv1d(Family f, int role) {
  return f == Family::gpt2 && (role == kQkvW || role == kAttnOutW || role == kFcW || role == kProjW);
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string run = describe_llmpi_run_dir(dir);
  if (!run.empty())
    fail("'", dir, "' is an llmpi run directory (it holds ", run, "), not a Hugging Face model directory: "
         "continue the run with --resume auto, or export it first with llmpi-export --checkpoint ", dir,
         " --out NEW_DIR");
  const std::string path = dir + "/config.json";
  const json j = read_json_file(path, ": --init-from takes a Hugging Face model directory holding config.json and "
                                      "model.safetensors (or model.safetensors.index.json)");
  ConfigReader r{j, path};
  HfConfig c;
  c.dir = dir;
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  const std::string type = r.string("model_type", "");
  if (arch.empty()) {  // no architectures: the base model of model_type
    arch = type == "gpt2" ? "GPT2Model" : type == "llama" ? "LlamaForCausalLM" : type == "bert" ? "BertModel" : "";
    if (arch.empty())
      fail("'", path, "' names no architecture and model_type \"", type, "\": llmpi reads GPT2LMHeadModel, GPT2Model, "
           "LlamaForCausalLM, BertModel and BertForSequenceClassification");
  }
  c.architecture = arch;
  c.source.name = "'" + path + "'";
  json& fx = c.source.fixed;
  json& df = c.source.defaults;
  if (arch == "GPT2LMHeadModel" || arch == "GPT2Model") {
    c.family = Family::gpt2;
    const int d = r.integer("n_embd", 768);
    fx["family"] = "gpt2";
    fx["n_layer"] = r.integer("n_layer", 12);
    fx["n_head"] = r.integer("n_head", 12);
    fx["d_model"] = d;
    fx["ffn_dim"] = r.integer("n_inner", 4 * d);
    fx["max_seq_len"] = r.integer("n_positions", 1024);
    fx["vocab_size"] = r.integer("vocab_size", 50257);
    fx["norm_eps"] = r.number("layer_norm_epsilon", 1e-5);
    fx["tie_embeddings"] = r.boolean("tie_word_embeddings", true);
    const std::string act = r.string("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      r.unsupported("activation_function", "gpt2 computes the tanh GELU (\"gelu_new\")");
    if (!r.boolean("scale_attn_weights", true)) r.unsupported("scale_attn_weights", "attention is scaled by 1/sqrt(head size)");
    if (r.boolean("scale_attn_by_inverse_layer_idx", false))
      r.unsupported("scale_attn_by_inverse_layer_idx", "attention is scaled by 1/sqrt(head size) only");
    df["dropout"] = r.number("resid_pdrop", 0.1);
    df["init_std"] = r.number("initializer_range", 0.02);
  } else if (arch == "LlamaForCausalLM") {
    c.family = Family::llama;
    const int d = r.integer("hidden_size", 4096), nh = r.integer("num_attention_heads", 32);
    fx["family"] = "llama";
    fx["n_layer"] = r.integer("num_hidden_layers", 32);
    fx["n_head"] = nh;
    fx["n_kv_head"] = r.integer("num_key_value_heads", nh);
    fx["d_model"] = d;
    fx["ffn_dim"] = r.integer("intermediate_size", 11008);
    fx["max_seq_len"] = r.integer("max_position_embeddings", 2048);
    fx["vocab_size"] = r.integer("vocab_size", 32000);
    fx["norm_eps"] = r.number("rms_norm_eps", 1e-6);
    fx["tie_embeddings"] = r.boolean("tie_word_embeddings", false);
    // rope_theta: top level (transformers 4) or in rope_parameters (transformers 5).
    double theta = r.number("rope_theta", 10000.0);
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      const json& rp = j[key];
      if (!rp.is_object()) r.unsupported(key, "expected an object");
      const std::string type = rp.value("rope_type", rp.value("type", std::string("default")));
      if (type != "default") r.unsupported(key, "only plain RoPE (rope_type \"default\") is implemented");
      if (rp.contains("rope_theta") && rp["rope_theta"].is_number()) theta = rp["rope_theta"].get<double>();
    }
    fx["rope_theta"] = theta;
    if (r.string("hidden_act", "silu") != "silu") r.unsupported("hidden_act", "llama's MLP is SwiGLU (\"silu\")");
    if (r.boolean("attention_bias", false)) r.unsupported("attention_bias", "llama's projections have no biases");
    if (r.boolean("mlp_bias", false)) r.unsupported("mlp_bias", "llama's projections have no biases");
    if (nh > 0 && j.contains("head_dim") && !j["head_dim"].is_null() && r.integer("head_dim", 0) != d / nh)
      r.unsupported("head_dim", "the head size must be hidden_size / num_attention_heads = " + std::to_string(d / nh));
    df["dropout"] = r.number("attention_dropout", 0.0);
    df["init_std"] = r.number("initializer_range", 0.02);
  } else if (arch == "BertModel" || arch == "BertForSequenceClassification") {
    c.family = Family::bert;
    c.has_classifier = arch == "BertForSequenceClassification";
    fx["family"] = "bert";
    fx["n_layer"] = r.integer("num_hidden_layers", 12);
    fx["n_head"] = r.integer("num_attention_heads", 12);
    fx["d_model"] = r.integer("hidden_size", 768);
    fx["ffn_dim"] = r.integer("intermediate_size", 3072);
    fx["max_seq_len"] = r.integer("max_position_embeddings", 512);
    fx["vocab_size"] = r.integer("vocab_size", 30522);
    fx["type_vocab_size"] = r.integer("type_vocab_size", 2);
    fx["norm_eps"] = r.number("layer_norm_eps", 1e-12);
    if (r.string("hidden_act", "gelu") != "gelu") r.unsupported("hidden_act", "bert computes the exact (erf) GELU, \"gelu\"");
    if (r.string("position_embedding_type", "absolute") != "absolute")
      r.unsupported("position_embedding_type", "bert uses learned absolute positions");
    if (r.boolean("is_decoder", false)) r.unsupported("is_decoder", "bert here is a bidirectional encoder");
    if (c.has_classifier) {
      int labels = 2;
      if (j.contains("id2label") && j["id2label"].is_object()) labels = static_cast<int>(j["id2label"].size());
      labels = r.integer("num_labels", labels);
      const std::string problem = r.string("problem_type", "single_label_classification");
      if (labels < 2 || problem != "single_label_classification")
        r.unsupported("problem_type", "the bert head is a single-label classifier with >= 2 labels (cross-entropy)");
      fx["num_labels"] = labels;
    }
    df["dropout"] = r.number("hidden_dropout_prob", 0.1);
    df["attn_dropout"] = r.number("attention_probs_dropout_prob", 0.1);
    df["init_std"] = r.number("initializer_range", 0.02);
  } else {
    fail("'", path, "': architecture \"", arch, "\" is not supported: llmpi reads GPT2LMHeadModel, GPT2Model, "
         "LlamaForCausalLM, BertModel and BertForSequenceClassification");
  }
  return c;
}

const HfWeights::Entry* HfWeights::find(const std::string& name) const {
  auto it = std::lower_bound(index.begin(), index.end(), name,
                             [](const std::pair<std::string, Entry>& e, const std::string& n) { return e.first < n; });
  return it != index.end() && it->first == name ? &it->second : nullptr;
}

HfWeights open_hf_weights(const std::string& dir) {
  HfWeights w;
  w.dir = dir;
  const std::string single = dir + "/model.safetensors", idx = dir + "/model.safetensors.index.json";
  std::vector<std::string> shards;
  json weight_map;
  if (is_file(single)) {
    shards.push_back("model.safetensors");
  } else if (is_file(idx)) {
    const json j = read_json_file(idx, "");
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("'", idx, "' has no \"weight_map\" object (tensor name → shard file)");
    weight_map = j["weight_map"];
    std::set<std::string> seen;
    for (auto& [name, f] : weight_map.items()) {
      if (!f.is_string()) fail("'", idx, "': the shard of \"", name, "\" is not a file name");
      const std::string file = f.get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        fail("'", idx, "': shard \"", file, "\" of \"", name, "\" must be a file name in the same directory");
      if (seen.insert(file).second) shards.push_back(file);
    }
  } else {
    fail("'", dir, "' holds neither model.safetensors nor model.safetensors.index.json: give a Hugging Face model "
         "directory saved with safetensors (transformers' save_pretrained(..., safe_serialization=True))");
  }
  for (const std::string& s : shards) w.files.push_back(std::make_unique<SafetensorsFile>(dir + "/" + s));
  for (size_t i = 0; i < w.files.size(); i++)
    for (const StTensor& t : w.files[i]->tensors()) {
      if (!weight_map.is_null()) {
        if (!weight_map.contains(t.name)) continue;  // the index decides which shard holds a tensor
        if (weight_map[t.name].get<std::string>() != shards[i]) continue;
      }
      w.index.push_back({t.name, {w.files[i].get(), &t}});
    }
  std::sort(w.index.begin(), w.index.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < w.index.size(); i++)
    if (w.index[i].first == w.index[i - 1].first)
      fail("'", dir, "': tensor \"", w.index[i].first, "\" is in two files (", w.index[i - 1].second.file->path(), ", ",
           w.index[i].second.file->path(), ")");
  if (!weight_map.is_null())
    for (auto& [name, f] : weight_map.items())
      if (!w.find(name))
        fail("'", idx, "' lists \"", name, "\" in ", f.get<std::string>(), ", but that file does not hold it");
  return w;
}

void load_hf_params(const std::string& dir, const ModelDesc& d, const ParamTable& t, uint64_t seed, float* host,
                    std::vector<std::string>* notes) {
  const HfWeights w = open_hf_weights(dir);
  const NameMap map = name_map(d.family, w);
  // 1. Every name, dtype and shape, before any value is read.
  struct Plan {
    const ParamSlice* slice;
    const HfWeights::Entry* entry;
  };
  std::vector<Plan> plan;
  std::vector<std::string> missing, mismatched, initialised;
  std::set<std::string> used;
  for (const ParamSlice& s : t.slices) {
    const std::string name = map(s.name);
    const HfWeights::Entry* e = w.find(name);
    if (!e) {
      const bool optional = d.family == Family::bert && (s.role == kPoolerW || s.role == kPoolerB ||
                                                         s.role == kClsW || s.role == kClsB);
      (optional ? initialised : missing).push_back(name);
      continue;
    }
    used.insert(name);
    std::vector<int64_t> want(s.shape.begin(), s.shape.end());
    if (hf_is_conv1d(d.family, s.role) && want.size() == 2) std::swap(want[0], want[1]);
    if (e->tensor->shape != want)
      mismatched.push_back(name + " is " + shape_str(e->tensor->shape) + ", the model needs " + shape_str(want));
    else if (!st_dtype_is_float(e->tensor->dtype))
      mismatched.push_back(name + " has dtype " + st_dtype_name(e->tensor->dtype) + ", not a float type");
    else
      plan.push_back({&s, e});
  }
  if (!missing.empty())
    fail("'", dir, "' lacks ", missing.size(), " tensor", missing.size() > 1 ? "s" : "", " the ", family_name(d.family),
         " model needs: ", name_list(missing, 12), "; is it a ", family_name(d.family), " checkpoint of this shape?");
  if (!mismatched.empty())
    fail("'", dir, "': ", mismatched.size(), " tensor", mismatched.size() > 1 ? "s do" : " does",
         " not have the model's shape: ", name_list(mismatched, 6),
         "; the checkpoint and its config.json disagree, or model.* was set to another shape");
  // 2. Values. Tensors the checkpoint lacks keep their initial values.
  if (!initialised.empty()) init_param_values(t, seed, host);
  std::vector<float> tmp;
  for (const Plan& p : plan) {
    const ParamSlice& s = *p.slice;
    float* dst = host + s.offset;
    if (hf_is_conv1d(d.family, s.role) && s.shape.size() == 2) {
      // Conv1D stores W^T: ours[o][i] = theirs[i][o], theirs [in = shape[1], out = shape[0]]
      const size_t out = s.shape[0], in = s.shape[1];
      tmp.resize(s.numel);
      p.entry->file->read_float(*p.entry->tensor, tmp.data());
      for (size_t o = 0; o < out; o++)
        for (size_t i = 0; i < in; i++) dst[o * in + i] = tmp[i * out + o];
    } else {
      p.entry->file->read_float(*p.entry->tensor, dst);
    }
  }
  if (notes) {
    if (!initialised.empty())
      notes->push_back("'" + dir + "' has no " + name_list(initialised) + ": initialised (weights N(0, " +
                       json(d.init_std).dump() + "), biases 0)");
    // Unused tensors are reported for the whole model only (a part leaves the others' tensors).
    const ParamTable whole = build_param_table(d);
    std::set<std::string> known;
    for (const ParamSlice& s : whole.slices) known.insert(map(s.name));
    std::vector<std::string> unused;
    for (auto& [name, e] : w.index) {
      if (known.count(name) || is_known_buffer(name)) continue;
      // A tied model's checkpoint may carry the head as a copy of the embedding.
      if (name == "lm_head.weight" && d.tie_embeddings) continue;
      unused.push_back(name);
    }
    if (!unused.empty())
      notes->push_back("'" + dir + "' has " + std::to_string(unused.size()) + " tensor" + (unused.size() > 1 ? "s" : "") +
                       " the " + family_name(d.family) + " model does not use: " + name_list(unused));
  }
}

ModelDesc hf_model_desc(const HfConfig& c) {
  json m = family_model_defaults(family_name(c.family));
  for (auto& [k, v] : c.source.defaults.items()) m[k] = v;
  for (auto& [k, v] : c.source.fixed.items()) m[k] = v;
  ModelConfig mc;
  mc.family = c.family;
  mc.n_layer = m["n_layer"];
  mc.n_head = m["n_head"];
  mc.n_kv_head = m.value("n_kv_head", 0);
  mc.d_model = m["d_model"];
  mc.ffn_dim = m["ffn_dim"];
  mc.max_seq_len = m["max_seq_len"];
  mc.seq_len = mc.max_seq_len;
  mc.vocab_size = m["vocab_size"];
  mc.num_labels = m.value("num_labels", 2);
  mc.type_vocab_size = m.value("type_vocab_size", 2);
  mc.init_std = m["init_std"];
  mc.norm_eps = m["norm_eps"];
  mc.rope_theta = m.value("rope_theta", 10000.0);
  mc.dropout = m["dropout"];
  mc.attn_dropout = m.value("attn_dropout", 0.0);
  mc.tie_embeddings = m.value("tie_embeddings", true);
  if (mc.n_layer < 1 || mc.n_head < 1 || mc.d_model < 1 || mc.d_model % mc.n_head != 0 || mc.vocab_size < 1 ||
      mc.max_seq_len < 1)
    fail(c.source.name, ": inconsistent shape (layers ", mc.n_layer, ", heads ", mc.n_head, ", width ", mc.d_model,
         ", vocabulary ", mc.vocab_size, ", positions ", mc.max_seq_len, ")");
  return model_desc_from_config(mc, mc.vocab_size);
}

HfModel load_hf_model(const std::string& dir, uint64_t seed) {
  const HfConfig c = read_hf_config(dir);
  HfModel m;
  m.desc = hf_model_desc(c);
  m.table = build_param_table(m.desc);
  m.params.assign(m.table.numel, 0.0f);
  load_hf_params(dir, m.desc, m.table, seed, m.params.data(), &m.notes);
  return m;
}

}  // namespace llmpi
