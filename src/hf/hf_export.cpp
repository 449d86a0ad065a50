#include "hf/hf_export.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hf/hf_import.h"
#include "hf/safetensors.h"
#include "metrics/metrics.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

using nlohmann::json;

namespace {

json id_or_null(int id) { return id >= 0 ? json(id) : json(nullptr); }

}  // namespace

json hf_config_json(const ModelDesc& d, const HfExportOptions& o) {
  json c;
  switch (d.family) {
    case Family::gpt2:
      c = {{"architectures", {"GPT2LMHeadModel"}},
           {"model_type", "gpt2"},
           {"vocab_size", d.vocab_size},
           {"n_positions", d.max_seq_len},
           {"n_embd", d.d_model},
           {"n_layer", d.n_layer},
           {"n_head", d.n_head},
           {"n_inner", d.ffn_dim},
           {"activation_function", "gelu_new"},
           {"layer_norm_epsilon", d.norm_eps},
           {"resid_pdrop", d.dropout},
           {"embd_pdrop", d.dropout},
           {"attn_pdrop", d.attn_dropout},
           {"initializer_range", d.init_std},
           {"scale_attn_weights", true},
           {"tie_word_embeddings", d.tie_embeddings}};
      break;
    case Family::llama:
      c = {{"architectures", {"LlamaForCausalLM"}},
           {"model_type", "llama"},
           {"vocab_size", d.vocab_size},
           {"hidden_size", d.d_model},
           {"intermediate_size", d.ffn_dim},
           {"num_hidden_layers", d.n_layer},
           {"num_attention_heads", d.n_head},
           {"num_key_value_heads", d.n_kv_head},
           {"head_dim", d.head_dim()},
           {"max_position_embeddings", d.max_seq_len},
           {"rms_norm_eps", d.norm_eps},
           {"rope_theta", d.rope_theta},
           {"hidden_act", "silu"},
           {"attention_bias", false},
           {"mlp_bias", false},
           {"attention_dropout", d.attn_dropout},
           {"initializer_range", d.init_std},
           {"tie_word_embeddings", d.tie_embeddings}};
      break;
    case Family::bert: {
      json id2label = json::object(), label2id = json::object();
      for (int i = 0; i < d.num_labels; i++) {
        const std::string name = i < static_cast<int>(o.label_names.size()) && !o.label_names[i].empty()
                                     ? o.label_names[i]
                                     : "LABEL_" + std::to_string(i);
        id2label[std::to_string(i)] = name;
        label2id[name] = i;
      }
      c = {{"architectures", {"BertForSequenceClassification"}},
           {"model_type", "bert"},
           {"vocab_size", d.vocab_size},
           {"hidden_size", d.d_model},
           {"num_hidden_layers", d.n_layer},
           {"num_attention_heads", d.n_head},
           {"intermediate_size", d.ffn_dim},
           {"hidden_act", "gelu"},
           {"hidden_dropout_prob", d.dropout},
           {"attention_probs_dropout_prob", d.attn_dropout},
           {"max_position_embeddings", d.max_seq_len},
           {"type_vocab_size", d.type_vocab_size},
           {"layer_norm_eps", d.norm_eps},
           {"initializer_range", d.init_std},
           {"position_embedding_type", "absolute"},
           {"problem_type", "single_label_classification"},
           {"id2label", id2label},
           {"label2id", label2id}};
      if (label2id.size() != static_cast<size_t>(d.num_labels))
        fail("export: the label names are not distinct; give each of the ", d.num_labels, " labels its own name");
      break;
    }
  }
  c["bos_token_id"] = id_or_null(o.bos_token_id);
  c["eos_token_id"] = id_or_null(o.eos_token_id);
  c["pad_token_id"] = id_or_null(o.pad_token_id);
  c["torch_dtype"] = "float32";
  return c;
}

void export_hf_model(const std::string& out_dir, const ModelDesc& d, const ParamTable& t, const TensorSource& source,
                     const HfExportOptions& o) {
  if (param_table_json(t) != param_table_json(build_param_table(d)))
    fail("export: the parameter table is not the whole ", family_name(d.family), " model's");
  // Our names are the Hugging Face ones of the exported architecture, except GPT-2's, which
  // GPT2LMHeadModel prefixes with "transformer." (its lm_head.weight stays as it is). Each
  // tensor is read when it is written (write_safetensors: one at a time).
  std::vector<StWriteTensor> out;
  // Written embedding first, head last (the reverse of the table's backward order), as
  // transformers lays them out.
  for (auto it = t.slices.rbegin(); it != t.slices.rend(); ++it) {
    const ParamSlice& s = *it;
    StWriteTensor w;
    w.name = d.family == Family::gpt2 && s.name != "lm_head.weight" ? "transformer." + s.name : s.name;
    w.shape.assign(s.shape.begin(), s.shape.end());
    const bool conv1d = hf_is_conv1d(d.family, s.role) && s.shape.size() == 2;
    if (conv1d) std::swap(w.shape[0], w.shape[1]);
    w.fill = [&source, s, conv1d](float* dst) {
      std::vector<float> ours;
      float* v = dst;
      if (conv1d) {
        ours.resize(s.numel);
        v = ours.data();
      }
      source(s, v);
      const std::string bad = nonfinite_slice(s, v);
      if (!bad.empty())
        fail("export: the model's weights are not finite: ", bad,
             "; nothing was written. The weights are damaged or their training diverged: export an earlier "
             "checkpoint");
      if (conv1d) {  // Conv1D keeps W^T: theirs[i][o] = ours[o][i]
        const size_t rows = s.shape[0], cols = s.shape[1];
        for (size_t r = 0; r < rows; r++)
          for (size_t c = 0; c < cols; c++) dst[c * rows + r] = v[r * cols + c];
      }
    };
    out.push_back(std::move(w));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail("cannot create '", out_dir, "': ", ec.message(), "; choose a writable --out directory");
  write_safetensors(out_dir + "/model.safetensors", out, {{"format", "pt"}});
  write_file_atomic(out_dir + "/config.json", hf_config_json(d, o).dump(2) + "\n");
}

void export_hf_model(const std::string& out_dir, const ModelDesc& d, const ParamTable& t, const float* params,
                     const HfExportOptions& o) {
  export_hf_model(
      out_dir, d, t,
      [params](const ParamSlice& s, float* out) { std::copy(params + s.offset, params + s.offset + s.numel, out); }, o);
}

}  // namespace llmpi
