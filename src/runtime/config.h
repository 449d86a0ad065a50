// The run configuration: a JSON file (nlohmann/json) plus `--set key.path=value` overrides,
// validated against the defaults document in config.cpp, which is also the list of every key.
// Unknown keys, wrong types and impossible values are Errors that name the key and the fix.
// A choice that is a word is an enum here (runtime/options.h): it is parsed once, when read.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "runtime/options.h"

namespace llmpi {

// The most transformer blocks a model may have (model.n_layer): the deepest transformers trained
// have a few hundred, and the parameter table, the pipeline's balancing of layers over stages and
// every per-layer loop grow with it, so a count beyond this is a mistake to refuse at once.
inline constexpr int kMaxLayers = 10000;

struct ModelConfig {
  Family family;
  int n_layer, n_head, d_model, seq_len;
  int n_kv_head;        // llama: key/value heads (0 = n_head)
  int ffn_dim;          // MLP hidden size (0 = the family's default)
  int max_seq_len;      // position table rows (0 = seq_len)
  int vocab_size;       // 0 = take it from the training file
  int num_labels;       // bert: classifier outputs
  int type_vocab_size;  // bert: token types
  double init_std, norm_eps, rope_theta;
  double dropout;       // hidden dropout, training only
  double attn_dropout;  // bert: attention-probability dropout, training only
  bool tie_embeddings;  // gpt2, llama: the LM head shares the token embedding
};
struct DataConfig {
  std::string train, val;  // HDF5 token files from llmpi-prep; val may be ""
};
struct TrainConfig {
  int64_t steps;           // steps to run (with epochs > 0: set by the trainer to epochs × steps per epoch)
  int epochs;              // > 0: run this many passes over the training data instead of `steps`
  int global_batch;        // sequences per step, summed over the data-parallel replicas (with batch_per_rank:
                           // batch_per_rank × replicas, set by resolve_batch)
  int batch_per_rank;      // > 0: sequences per step per data-parallel replica, whatever their number (weak
                           // scaling), instead of a fixed global_batch; 0 = global_batch is given
  bool drop_last;          // true: an epoch's last partial global batch is dropped; false: it is a shorter step
  LrSchedule lr_schedule;  // after the warm-up
  double lr, min_lr_ratio; // peak LR; cosine/linear decay to lr * min_lr_ratio at `steps`. After
                           // resolve_batch, lr is the configured rate × lr_factor (`resolved` keeps the configured one)
  LrScaling lr_scaling;    // how the peak LR follows the global batch (resolve_batch)
  int lr_reference_batch;  // the global batch the configured train.lr is meant for; 0 = batch_per_rank
  double lr_factor = 1;    // the factor lr_scaling applied (1 until resolve_batch)
  int64_t warmup_steps;    // linear warm-up from lr/warmup to lr (the scaled lr: Goyal et al.'s gradual warm-up)
  double weight_decay, beta1, beta2, eps;
  OptimizerKind optimizer;
  double grad_clip;        // global-norm clip; 0 = off
  uint64_t seed;
  int64_t log_every, eval_every;  // eval_every 0 = only at the end
  int eval_batches;        // global batches of the val file per evaluation; 0 = the whole file
  OnNonfinite on_nonfinite;  // a non-finite loss or gradient norm
  int max_consecutive_skips;  // on_nonfinite skip: the run stops after this many skipped steps in a row
};
struct ParallelConfig {
  SyncMethod sync;
  double bucket_mb;        // 0 = one collective per tensor; else buckets of about this size
  double first_bucket_mb;  // the first bucket's size limit (DDP-style small first bucket)
  bool overlap;            // reduce buckets on a communication thread during backward
  int poll_us;             // overlap: poll the nonblocking collective every poll_us (0 = blocking call)
  int average_every;       // weights: average parameters every k steps
  // Pipeline parallelism (engine/engine.h runs the stages); pp_stages 1 = none.
  int pp_stages;           // stages per pipeline; world = data-parallel replicas × pp_stages
  int microbatches;        // micro-batches per step per data-parallel replica: gradient accumulation
                           // (pp_stages 1), or the pipeline's micro-batches (must divide the replica's batch)
  ScheduleKind schedule;
  int virtual_stages;      // interleaved: model chunks per stage
  std::vector<int> stage_layers;  // blocks per (virtual) stage, in order; empty = balanced by cost
  // Tensor parallelism (model/transformer.h "Tensor parallelism"): ranks sharing each layer; 1 = none.
  // world = data-parallel replicas × pp_stages × tp.
  int tp = 1;
  // Sequence parallelism (with tp > 1): norms, residuals and hidden dropout on each rank's rows.
  bool sequence_parallel = false;
  // Sharded data parallelism (comm/grad_sync.h "ZeRO"), parallel.zero: 0 none; 1 (ZeRO-1) each
  // data-parallel rank keeps the AdamW moments of its shard only, gradients are reduce-scattered and
  // parameters all-gathered; 2 (ZeRO-2) the rank also keeps only its pieces of the gradient; 3
  // (ZeRO-3) and of the transformer blocks' parameters, each block gathered when it runs.
  int zero = 0;
  // ZeRO-2/3 with gradient accumulation (pp_stages 1, microbatches > 1): each micro-batch's gradient
  // reduce-scattered as its backward finishes it (micro_batch), or the whole gradient once after the
  // last micro-batch (step). comm/grad_sync.h says what each costs.
  ZeroReduce zero_reduce = ZeroReduce::micro_batch;
  // The gradient's type in the exchange (comm/grad_sync.h): fp32, or bf16 for half the bytes
  // (each bucket rounded to bfloat16, summed in fp32 and rounded again at every reduction step).
  GradDtype grad_dtype = GradDtype::fp32;
};
struct RuntimeConfig {
  DeviceChoice device;
  GemmPrecision precision;  // the dense layers' GEMMs (backend/gemm_precision.h); tf32 only on CUDA
  CpuBf16Gemm cpu_bf16_gemm;  // the CPU's bf16 GEMMs (backend/cpu/onednn_gemm.h)
  CpuFp32Gemm cpu_fp32_gemm;  // the CPU's fp32 dense-layer GEMMs (backend/cpu/onednn_gemm.h)
  AttentionChoice attention;  // model/model_desc.h resolve_attention
  Recompute recompute;     // which activations backward recomputes instead of keeping (model/transformer.h)
  int threads;             // OpenMP/OpenBLAS threads per rank; 0 = cores on the node / ranks on it
  int trace_steps;         // record trace-rank{N}.json for the first trace_steps steps (0 = off)
  double step_timeout_s;   // abort when one phase of a step takes longer (0 = off)
  int lm_head_chunk_rows;  // rows per chunk of the LM head (0 = one chunk's logits within 256 MiB)
  bool memory_check;       // refuse a configuration whose memory estimate exceeds what the node has
};
struct RunConfig {
  std::string dir;
};
struct MetricsConfig {
  bool tensorboard = true;  // TensorBoard event files in run.dir (metrics/tensorboard.h)
};
struct CheckpointConfig {
  int64_t every;  // save every k steps (and at the end and on pre-emption); 0 = only on pre-emption
  int keep;       // keep the newest k checkpoints
  bool async;     // the write runs behind the next steps (train/run.h "checkpoints")
};

// A JSON document held by value where only nlohmann/json_fwd.hpp is seen: this header is in
// nearly every translation unit, and the whole of nlohmann/json.hpp costs each of them seconds of
// compile time. Copies (and moves) are deep. Reading or changing the document (*doc, doc->, doc["key"]) takes
// nlohmann/json.hpp where that is done.
class JsonDoc {
 public:
  JsonDoc();  // an empty object
  JsonDoc(const nlohmann::json& j);
  JsonDoc(const JsonDoc& o);
  JsonDoc& operator=(const JsonDoc& o);
  ~JsonDoc();
  nlohmann::json& operator*() { return *j_; }
  const nlohmann::json& operator*() const { return *j_; }
  nlohmann::json* operator->() { return j_.get(); }
  const nlohmann::json* operator->() const { return j_.get(); }
  nlohmann::json& operator[](const char* key);
  const nlohmann::json& operator[](const char* key) const;  // (the key must exist)

 private:
  std::unique_ptr<nlohmann::json> j_;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  RuntimeConfig runtime;
  RunConfig run;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  JsonDoc resolved;  // every key with its final value, as written to run_dir/config.json
  std::vector<std::string> given;  // the keys the user set ("train.lr"), in the order given
};

// The defaults document: every valid key with its default value and type. The model section
// holds the union of every family's keys; family_model_defaults() says which apply to a family
// and with which defaults.
const nlohmann::json& config_defaults();
// The model.* keys of one family with that family's defaults (throws Error for an unknown family).
nlohmann::json family_model_defaults(const std::string& family);

struct ModelSource;  // model.* values from elsewhere (runtime/model_source.h)

// Parse JSON text (source names it in messages), apply `key.path=value` overrides (value parsed as
// JSON when it parses, else taken as a string), then the model source's values, validate, and
// fill the structs.
Config parse_config(const std::string& json_text, const std::string& source,
                    const std::vector<std::string>& overrides = {}, const ModelSource* model_source = nullptr);
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   const ModelSource* model_source = nullptr);

// The batch and the learning rate of a run of `replicas` data-parallel replicas (world size /
// parallel.pp_stages), resolved once the world size is known (llmpi-train at start-up, llmpi-plan
// with its --world):
//   train.batch_per_rank > 0: train.global_batch = batch_per_rank × replicas, in `resolved` too (so
//     config.json and checkpoints record the global batch the run used: the resume contract compares
//     it). A step's batch is given by one of the two keys; parse_config drops the file's one when
//     --set gives the other; given together at the same level (a run's config.json records both),
//     they must agree, else an Error naming both.
//   train.lr_scaling: linear lr × G / R, sqrt lr × √(G / R), none lr; G the global batch, R
//     train.lr_reference_batch (0: train.batch_per_rank, so linear multiplies by the replicas, as in
//     Goyal et al. 2017). lr_factor records the factor; the warm-up ramps to the scaled rate.
// Idempotent: it starts from the configured values in `resolved`.
void resolve_batch(Config& c, int replicas);

// The keys the user set that do nothing in the configuration they are in ("parallel.schedule" with
// parallel.pp_stages 1, say), one line each naming the key, why, and what would use it: the
// trainer prints them as start-up warnings. pp_stages and data.val are as configured.
std::vector<std::string> keys_without_effect(const Config& c);

}  // namespace llmpi
