#include "runtime/config_keys.h"

#include <algorithm>
#include <set>

#include "runtime/config.h"
#include "runtime/options.h"

namespace llmpi {

using nlohmann::json;

const std::vector<ConfigKeyDoc>& config_key_docs() {
  static const std::vector<ConfigKeyDoc> docs = {
      // model: where a key acts is the families that take it (family_model_defaults)
      {"model.family", "", "the model family: \"gpt2\", \"llama\" or \"bert\"; a key of another family is an error"},
      {"model.n_layer", "", "transformer blocks, 1..10000"},
      {"model.n_head", "", "attention heads (query heads for llama)"},
      {"model.n_kv_head", "", "key/value heads, grouped-query attention (0 = n_head)"},
      {"model.d_model", "", "width of the residual stream"},
      {"model.ffn_dim", "",
       "MLP hidden size (0 = 4 x d_model for gpt2 and bert, 8/3 x d_model rounded up to 64 for llama)"},
      {"model.seq_len", "", "tokens per training sequence (at most max_seq_len)"},
      {"model.max_seq_len", "", "rows of the position table, the longest sequence the model takes (0 = seq_len)"},
      {"model.vocab_size", "", "vocabulary size (0 = the vocabulary of data.train)"},
      {"model.num_labels", "", "classifier outputs"},
      {"model.type_vocab_size", "", "token types (segments)"},
      {"model.init_std", "", "standard deviation of the normal initialisation of weights"},
      {"model.norm_eps", "", "epsilon of LayerNorm (gpt2, bert) or RMSNorm (llama)"},
      {"model.rope_theta", "", "base of the rotary position frequencies"},
      {"model.dropout", "", "dropout on hidden states, training only"},
      {"model.attn_dropout", "", "dropout on attention probabilities, training only"},
      {"model.tie_embeddings", "", "the LM head shares the token embedding"},
      // data
      {"data.train", "",
       "required: a token file or data set from llmpi-prep (DIR, DIR/train, DIR/train.h5; gpt2, llama) or a "
       "classification file (bert)"},
      {"data.val", "", "optional validation split (DIR/val, a token file, or a classification file; \"\" = none)"},
      // train
      {"train.steps", "", "optimizer steps to run (ignored when train.epochs > 0)"},
      {"train.epochs", "",
       "passes over the training data (0 = run train.steps); steps are derived and there is an evaluation at "
       "every epoch end"},
      {"train.global_batch", "",
       "sequences per step over all ranks, a multiple of the data-parallel replicas (or give "
       "train.batch_per_rank instead)"},
      {"train.batch_per_rank", "",
       "sequences per step per data-parallel replica, instead of train.global_batch: the global batch is this x "
       "world / pp_stages (weak scaling; 0 = use train.global_batch)"},
      {"train.lr_scaling", "",
       "the peak rate follows the global batch: \"none\", \"linear\" (lr x global_batch / "
       "lr_reference_batch) or \"sqrt\"; the warm-up ramps to the scaled rate"},
      {"train.lr_reference_batch", "train.lr_scaling linear or sqrt",
       "the global batch train.lr is meant for (0 = train.batch_per_rank)"},
      {"train.drop_last", "train.epochs > 0",
       "false: an epoch's last partial batch is a shorter step; true: it is dropped"},
      {"train.optimizer", "", "\"adamw\" (decoupled weight decay on 2-D weights only) or \"sgd\""},
      {"train.lr", "", "peak learning rate"},
      {"train.lr_schedule", "", "decay after the warm-up: \"cosine\", \"linear\" or \"constant\""},
      {"train.min_lr_ratio", "", "the schedule decays to lr x min_lr_ratio"},
      {"train.warmup_steps", "", "linear warm-up steps from 0 to lr"},
      {"train.weight_decay", "", "decoupled weight decay (never on biases or norm weights)"},
      {"train.beta1", "train.optimizer adamw", "AdamW's first-moment decay"},
      {"train.beta2", "train.optimizer adamw", "AdamW's second-moment decay"},
      {"train.eps", "train.optimizer adamw", "AdamW's epsilon"},
      {"train.grad_clip", "", "clip the global gradient norm to this (0 = no clipping)"},
      {"train.seed", "", "seed of initialisation, shuffling and dropout"},
      {"train.log_every", "", "log a step to metrics.jsonl and the console every N steps (the first five always)"},
      {"train.eval_every", "data.val", "evaluate every N steps (0 = only at the end)"},
      {"train.eval_batches", "data.val", "global batches per evaluation (0 = the whole validation split)"},
      {"train.on_nonfinite", "",
       "a NaN/inf loss or gradient norm: \"abort\" stops with an error, \"skip\" leaves the parameters untouched "
       "for that step"},
      {"train.max_consecutive_skips", "train.on_nonfinite skip",
       "the run stops after this many non-finite steps in a row"},
      // parallel
      {"parallel.sync", "",
       "gradient synchronisation: \"allreduce\", \"gather_scatter\" (through rank 0), \"weights\" (average "
       "parameters every average_every steps) or \"nccl\" (CUDA backend)"},
      {"parallel.bucket_mb", "",
       "size of a gradient bucket, one collective each (0 = one per tensor; huge = one for the whole gradient)"},
      {"parallel.first_bucket_mb", "parallel.overlap", "size of the first bucket backward finishes"},
      {"parallel.overlap", "",
       "reduce each bucket on a communication thread while backward goes on (needs MPI_THREAD_MULTIPLE)"},
      {"parallel.poll_us", "parallel.overlap",
       "sleep between MPI_Test polls of the communication thread (0 = blocking collectives)"},
      {"parallel.average_every", "parallel.sync weights", "steps between parameter averages"},
      {"parallel.pp_stages", "", "pipeline stages (1 = no pipeline); the world size must be a multiple"},
      {"parallel.sequence_parallel", "parallel.tp > 1",
       "sequence parallelism: norms, residual adds and hidden dropout on each tensor-parallel rank's rows of a "
       "micro-batch (all-gather / reduce-scatter instead of all-reduce); model.seq_len a multiple of tp"},
      {"parallel.tp", "",
       "tensor-parallel ranks sharing each layer (Megatron's split of heads, MLP channels and vocabulary; 1 = "
       "none); adjacent ranks; the world size must be a multiple of pp_stages × tp"},
      {"parallel.microbatches", "",
       "a pipeline's micro-batches per step; with pp_stages 1, gradient accumulation: micro-batches per step, "
       "one gradient sync"},
      {"parallel.schedule", "parallel.pp_stages > 1", "pipeline schedule: \"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\""},
      {"parallel.virtual_stages", "parallel.pp_stages > 1",
       "model chunks per stage of the interleaved schedule (1 = not interleaved)"},
      {"parallel.stage_layers", "parallel.pp_stages > 1",
       "layers of each (virtual) stage, e.g. [1,3] ([] = balanced by estimated cost)"},
      {"parallel.zero", "", "1 = ZeRO-1: each data-parallel rank keeps the optimizer state of its shard only"},
      {"parallel.grad_dtype", "parallel.sync allreduce or nccl",
       "the gradient on the wire: \"fp32\" or \"bf16\" (half the bytes, rounded sums)"},
      // runtime
      {"runtime.device", "", "\"auto\" (CUDA when every rank has a GPU, else CPU), \"cpu\" or \"cuda\""},
      {"runtime.precision", "",
       "the dense layers' GEMMs: \"fp32\", \"bf16\" (operands rounded to bf16, fp32 accumulation) or \"tf32\" "
       "(CUDA only); everything else stays fp32"},
      {"runtime.cpu_bf16_gemm", "runtime.precision bf16 on the CPU",
       "\"auto\" (onednn where it takes at most 95% of emulate's time on the run's own GEMMs, timed at start-up, "
       "else emulate; a resumed run keeps its checkpoint's), \"onednn\" (oneDNN's bf16 matmul) or \"emulate\" "
       "(operands rounded to bf16, then an fp32 sgemm: the exact oracle)"},
      {"runtime.cpu_fp32_gemm", "runtime.precision fp32 on the CPU",
       "\"auto\" (onednn where it takes at most 95% of openblas's time on the run's own GEMMs, timed at start-up, "
       "else openblas; a resumed run keeps its checkpoint's), \"onednn\" (oneDNN's fp32 matmul) or \"openblas\" "
       "(sgemm); the two agree up "
       "to the order of the fp32 sums"},
      {"runtime.recompute", "",
       "activation recomputation in backward: \"none\", \"selective\" (MLP activations, full attention's "
       "probabilities, norm outputs) or \"full\" (each block's forward again); the same bits, less memory; "
       "not with schedule zb-h1"},
      {"runtime.attention", "",
       "\"auto\" (fused on CUDA for head sizes <= 128, else full), \"full\" (keeps the T x T probabilities of "
       "every layer) or \"fused\" (one log-sum-exp per query row, never a T x T matrix)"},
      {"runtime.threads", "", "OpenMP/OpenBLAS threads per rank (0 = cores / ranks on the node)"},
      {"runtime.trace_steps", "", "per-rank Chrome trace (trace-rank{N}.json) of the first N steps (0 = off)"},
      {"runtime.step_timeout_s", "",
       "abort a step that spends longer than this in one phase, naming the step and phase (0 = off)"},
      {"runtime.memory_check", "", "refuse at start-up a configuration whose memory estimate does not fit the node"},
      {"runtime.lm_head_chunk_rows", "",
       "rows per chunk of the LM head, which never stores all N x V logits (0 = as many as fit 256 MiB of fp32 "
       "logits)"},
      // run, checkpoint
      {"run.dir", "", "the run directory: config.json, metrics.jsonl, eval.jsonl, checkpoints/, traces"},
      {"checkpoint.every", "",
       "write a checkpoint every N steps and at the end (0 = only when the run is pre-empted)"},
      {"checkpoint.keep", "", "keep the newest N checkpoints of this run"},
      {"checkpoint.async", "",
       "true: a checkpoint's values are copied to host memory and written while training goes on (the next "
       "checkpoint, a pre-emption or the end of the run waits for it); false: the step waits for the write"},
  };
  return docs;
}

namespace {

const ConfigKeyDoc* find_doc(const std::string& key) {
  for (const ConfigKeyDoc& d : config_key_docs())
    if (key == d.key) return &d;
  return nullptr;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

const Family kFamilies[] = {Family::gpt2, Family::llama, Family::bert};

// For a model key: the families that take it, and its defaults as Markdown ("`1e-05` (bert: `1e-12`)").
struct ModelKeyUse {
  std::vector<std::string> families;
  std::string defaults;
};
ModelKeyUse model_key_use(const std::string& k) {
  ModelKeyUse use;
  const std::string base = config_defaults()["model"][k].dump();
  std::vector<std::string> differing;
  for (Family f : kFamilies) {
    const json m = family_model_defaults(option_name(f));
    if (!m.contains(k)) continue;
    use.families.push_back(option_name(f));
    if (k != "family" && m[k].dump() != base) differing.push_back(std::string(option_name(f)) + ": `" + m[k].dump() + "`");
  }
  use.defaults = "`" + base + "`";
  if (!differing.empty()) use.defaults += " (" + joined(differing, ", ") + ")";
  return use;
}

// Every key of the defaults document: the described ones in the table's order (model, data, train,
// parallel, runtime, run, checkpoint), then any without a description.
std::vector<std::pair<std::string, std::string>> keys_in_order() {  // (section, key)
  std::vector<std::pair<std::string, std::string>> keys;
  const json& d = config_defaults();
  for (const ConfigKeyDoc& doc : config_key_docs()) {
    const std::string k = doc.key, sec = k.substr(0, k.find('.')), name = k.substr(k.find('.') + 1);
    if (d.contains(sec) && d[sec].contains(name)) keys.emplace_back(sec, name);
  }
  for (auto& [sec, obj] : d.items())
    for (auto& [k, v] : obj.items())
      if (!find_doc(sec + "." + k)) keys.emplace_back(sec, k);
  return keys;
}

std::string description_of(const std::string& key) {
  const ConfigKeyDoc* d = find_doc(key);
  return d ? d->description : "(no description: add one in src/runtime/config_keys.cpp)";
}

}  // namespace

std::vector<std::string> config_key_docs_missing() {
  std::vector<std::string> missing;
  std::set<std::string> keys;
  for (auto& [sec, obj] : config_defaults().items())
    for (auto& [k, v] : obj.items()) {
      keys.insert(sec + "." + k);
      if (!find_doc(sec + "." + k)) missing.push_back(sec + "." + k + ": no description");
    }
  std::set<std::string> described;
  for (const ConfigKeyDoc& d : config_key_docs()) {
    if (!keys.count(d.key)) missing.push_back(std::string(d.key) + ": described but not a key");
    if (!described.insert(d.key).second) missing.push_back(std::string(d.key) + ": described twice");
  }
  return missing;
}

std::string config_keys_help() {
  auto line = [](const std::string& key, const json& v) {
    std::string l = "  " + key;
    l.resize(std::max<size_t>(l.size() + 1, 30), ' ');
    l += "default " + v.dump();
    l.resize(std::max<size_t>(l.size() + 2, 48), ' ');
    return l + description_of(key) + "\n";
  };
  std::string s = "\nConfiguration keys (JSON sections and keys; --set section.key=value overrides):\n";
  for (auto& [sec, k] : keys_in_order()) {
    if (sec == "model") continue;
    s += line(sec + "." + k, config_defaults()[sec][k]);
    const ConfigKeyDoc* d = find_doc(sec + "." + k);
    if (d && *d->acts) s += std::string(48, ' ') + "(acts with " + d->acts + ")\n";
  }
  s += "\nModel keys by family (model.family = \"gpt2\" | \"llama\" | \"bert\"; a key of another family is an error):\n";
  for (Family f : kFamilies) {
    const std::string name = option_name(f);
    s += " " + name + (f == Family::gpt2 ? " (the default)" : "") + ":\n";
    const json keys = family_model_defaults(name);  // (items() of a temporary would dangle)
    for (auto& [k, v] : keys.items())
      if (k != "family") s += line("model." + k, v);
  }
  return s;
}

std::string config_keys_markdown() {
  auto cell = [](std::string t) {
    std::string out;
    for (char c : t) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string s = "| key | default | acts with | description |\n|---|---|---|---|\n";
  for (auto& [sec, k] : keys_in_order()) {
    const std::string key = sec + "." + k;
    std::string def = "`" + cell(config_defaults()[sec][k].dump()) + "`", acts;
    if (sec == "model") {
      const ModelKeyUse use = model_key_use(k);
      def = cell(use.defaults);
      acts = use.families.size() == 3 ? "" : joined(use.families, ", ");
    } else if (const ConfigKeyDoc* d = find_doc(key)) {
      acts = d->acts;
    }
    s += "| `" + key + "` | " + def + " | " + cell(acts) + " | " + cell(description_of(key)) + " |\n";
  }
  return s;
}

}  // namespace llmpi
