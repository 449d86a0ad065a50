// Hugging Face model directories in: config.json + model.safetensors (or the shards listed by
// model.safetensors.index.json), for GPT2LMHeadModel / GPT2Model (family gpt2),
// LlamaForCausalLM (llama) and BertModel / BertForSequenceClassification (bert).
//
// config.json → model.* keys. The shape keys (family, n_layer, n_head, n_kv_head, d_model,
// ffn_dim, max_seq_len, vocab_size, norm_eps, rope_theta, tie_embeddings, type_vocab_size, and
// num_labels when the checkpoint has a classifier) are FIXED by the weights: a different value
// set by the user is an error naming both (runtime/config.h, ModelSource). dropout, attn_dropout
// and init_std are DEFAULTS: taken from config.json unless the user sets them. Anything our
// families cannot compute (another activation, rope scaling, attention biases on llama, a
// regression head, ...) is refused with the key and its value.
//
// Tensors: each slice of the parameter table has a Hugging Face name (model/families/*.cpp) and
// is found in the files under that name, with the prefix the architecture uses ("transformer."
// for GPT2LMHeadModel, none for BertModel where ours say "bert."). GPT-2's Conv1D weights
// (c_attn, attn.c_proj, c_fc, mlp.c_proj) are stored [in, out] and transposed to our [out, in].
// LLaMA's q_proj/k_proj need no permutation: Hugging Face checkpoints are already in the
// rotate-half layout our RoPE uses (the permutation in Hugging Face's conversion script turns
// Meta's interleaved-pair layout into this one); the fixture logits test this.
//
// Every name and shape is checked before any value is read; all missing tensors are reported
// together. A BertModel checkpoint has no classifier (and some have no pooler): those are
// initialised (N(0, init_std) weights, zero biases) and a note says so. Tensors of the files
// that the model does not use are listed in a note (known buffers such as GPT-2's attn.bias and
// BERT's position_ids are skipped silently). fp32, fp16, bf16 and fp64 values become fp32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hf/safetensors.h"
#include "model/model_desc.h"
#include "params/param_table.h"
#include "runtime/config.h"
#include "runtime/model_source.h"

namespace llmpi {

// What config.json says, as model.* values.
struct HfConfig {
  std::string dir, architecture;  // architecture: e.g. "GPT2LMHeadModel"
  Family family = Family::gpt2;
  bool has_classifier = false;    // BertForSequenceClassification
  ModelSource source;             // fixed + default model.* values, named "'DIR/config.json'"
};
// An llmpi run directory (hf/export_dir.h) is refused, naming --resume and llmpi-export.
HfConfig read_hf_config(const std::string& dir);

// The tensors of a model directory: one file or several shards, each memory-mapped.
struct HfWeights {
  std::string dir;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  struct Entry {
    const SafetensorsFile* file;
    const StTensor* tensor;
  };
  std::vector<std::pair<std::string, Entry>> index;  // sorted by name
  const Entry* find(const std::string& name) const;
};
HfWeights open_hf_weights(const std::string& dir);

// Whether a role's tensor is a GPT-2 Conv1D weight, stored transposed ([in, out]) by Hugging Face.
bool hf_is_conv1d(Family f, int role);

// Fill host[0, t.numel) with the table's tensors from the directory (t may be a part of the model:
// only its tensors are read). Tensors the checkpoint may lack (BERT's pooler and classifier) keep
// their initial values from `seed`. Notes (one line each) are appended to *notes.
void load_hf_params(const std::string& dir, const ModelDesc& d, const ParamTable& t, uint64_t seed, float* host,
                    std::vector<std::string>* notes = nullptr);

// The description config.json gives when nothing else is configured (seq_len = max_seq_len).
ModelDesc hf_model_desc(const HfConfig& c);

// A whole model from a Hugging Face directory: its description, table and parameters (host,
// table layout). For programs that load a model without a training configuration (llmpi-sample).
struct HfModel {
  ModelDesc desc;
  ParamTable table;
  std::vector<float> params;
  std::vector<std::string> notes;  // what was initialised, what was not used
};
HfModel load_hf_model(const std::string& dir, uint64_t seed = 1337);

}  // namespace llmpi
