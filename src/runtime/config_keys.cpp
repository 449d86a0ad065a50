#include "runtime/config_keys.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "runtime/error.h"
#include "runtime/options.h"

namespace llmpi {

using nlohmann::json;

namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
KeyRange none() { return {kNone, kNone}; }
KeyRange at_least(double lo, const char* note = "") { return {lo, kNone, false, false, note}; }
KeyRange above(double lo, const char* note = "") { return {lo, kNone, true, false, note}; }
KeyRange within(double lo, double hi, bool hi_open, const char* note = "") { return {lo, hi, false, hi_open, note}; }

// The integer at `path` as T, which must hold it exactly (4.0 and 1e3 are 4 and 1000): a value
// outside T's range is an error, never wrapped or clamped.
template <typename T>
T as_int(const json& v, const char* path) {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  bool ok;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= uint64_t(hi);
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    ok = i >= 0 ? uint64_t(i) <= uint64_t(hi) : std::is_signed<T>::value && i >= int64_t(lo);
  } else {
    double d = v.get<double>();  // whole (the type check); hi + 1.0 is a power of two, exact
    ok = d >= double(lo) && d < double(hi) + 1.0;
  }
  if (!ok) fail("config: '", path, "' must be an integer in ", +lo, "..", +hi, ", got ", v.dump());
  return v.get<T>();
}

// The value at `path` as the field's type: an enum from its word (an unknown word is an error
// listing the valid ones, and `note`), an integer exactly, a number, a string, a boolean or a list
// of integers.
template <typename T>
T value_as(const json& v, const char* path, const char* note) {
  if constexpr (std::is_enum_v<T>) {
    T e{};
    const std::string word = v.get<std::string>();
    if (!parse_option(word, &e)) fail("config: '", path, "' must be ", option_words<T>(), note, ", got \"", word, "\"");
    return e;
  } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string> || std::is_floating_point_v<T>) {
    return v.get<T>();
  } else if constexpr (std::is_integral_v<T>) {
    return as_int<T>(v, path);
  } else {
    T list;
    for (const json& e : v) list.push_back(as_int<int>(e, path));
    return list;
  }
}

// How a key is read: into field `f` of section `s` (note: an enum's error's words after the list).
template <typename S, typename T>
std::function<void(Config&, const json&)> into(S Config::*s, T S::*f, const char* path, const char* note = "") {
  return [s, f, path, note](Config& c, const json& v) { c.*s.*f = value_as<T>(v, path, note); };
}

using NoEffect = std::function<std::string(const Config&)>;
// No effect when `off`, with `why`.
NoEffect unless(std::function<bool(const Config&)> acts, std::string why) {
  return [acts, why](const Config& c) { return acts(c) ? std::string() : why; };
}
const NoEffect kAlways = [](const Config&) { return std::string(); };
const NoEffect kPipelineOnly = unless([](const Config& c) { return c.parallel.pp_stages > 1; },
                                      "with parallel.pp_stages 1: it shapes pipeline stages (set parallel.pp_stages "
                                      "> 1 to use one)");
const NoEffect kWithVal = unless([](const Config& c) { return !c.data.val.empty(); },
                                 "without data.val: there is no validation split to evaluate");
const NoEffect kAdamW = unless([](const Config& c) { return c.train.optimizer != OptimizerKind::sgd; },
                               "with train.optimizer \"sgd\"");

constexpr unsigned kGpt2 = 1u << int(Family::gpt2), kLlama = 1u << int(Family::llama), kBert = 1u << int(Family::bert);
constexpr unsigned kAll = kGpt2 | kLlama | kBert;

// A model key: read into ModelConfig, taken by `families`.
ConfigKey model_key(const char* key, json def, KeyRange range, unsigned families, json family_defaults,
                    std::function<void(Config&, const json&)> read, const char* description) {
  return {key, std::move(def), range, "", description, families, std::move(family_defaults), std::move(read), kAlways};
}
// Any other key.
ConfigKey key(const char* key, json def, KeyRange range, const char* acts, const char* description,
              std::function<void(Config&, const json&)> read, NoEffect no_effect = kAlways) {
  return {key, std::move(def), range, acts, description, 0, json::object(), std::move(read), std::move(no_effect)};
}

using MC = ModelConfig;
using TC = TrainConfig;
using PC = ParallelConfig;
using RC = RuntimeConfig;

std::vector<ConfigKey> make_keys() {
  const json no = json::object();
  return {
      // model: where a key acts is the families that take it
      model_key("model.family", "gpt2", none(), kAll, no, into(&Config::model, &MC::family, "model.family"),
                "the model family: \"gpt2\", \"llama\" or \"bert\"; a key of another family is an error"),
      model_key("model.n_layer", 4, within(1, kMaxLayers, false, "(transformer blocks; the deepest models trained "
                                           "have a few hundred)"),
                kAll, no, into(&Config::model, &MC::n_layer, "model.n_layer"), "transformer blocks, 1..10000"),
      model_key("model.n_head", 4, at_least(1), kAll, no, into(&Config::model, &MC::n_head, "model.n_head"),
                "attention heads (query heads for llama)"),
      model_key("model.n_kv_head", 0, at_least(0, "(0 = n_head)"), kLlama, no,
                into(&Config::model, &MC::n_kv_head, "model.n_kv_head"),
                "key/value heads, grouped-query attention (0 = n_head)"),
      model_key("model.d_model", 256, none(), kAll, no, into(&Config::model, &MC::d_model, "model.d_model"),
                "width of the residual stream"),
      model_key("model.ffn_dim", 0, at_least(0, "(0 = the family's default)"), kAll, no,
                into(&Config::model, &MC::ffn_dim, "model.ffn_dim"),
                "MLP hidden size (0 = 4 x d_model for gpt2 and bert, 8/3 x d_model rounded up to 64 for llama)"),
      model_key("model.seq_len", 256, at_least(1), kAll, no, into(&Config::model, &MC::seq_len, "model.seq_len"),
                "tokens per training sequence (at most max_seq_len)"),
      model_key("model.max_seq_len", 0, at_least(0, "(0 = seq_len)"), kAll, no,
                into(&Config::model, &MC::max_seq_len, "model.max_seq_len"),
                "rows of the position table, the longest sequence the model takes (0 = seq_len)"),
      model_key("model.vocab_size", 0, at_least(0, "(0 = from the training file)"), kAll, no,
                into(&Config::model, &MC::vocab_size, "model.vocab_size"),
                "vocabulary size (0 = the vocabulary of data.train)"),
      model_key("model.num_labels", 2, at_least(1), kBert, no, into(&Config::model, &MC::num_labels, "model.num_labels"),
                "classifier outputs"),
      model_key("model.type_vocab_size", 2, at_least(1), kBert, no,
                into(&Config::model, &MC::type_vocab_size, "model.type_vocab_size"), "token types (segments)"),
      model_key("model.init_std", 0.02, above(0), kAll, no, into(&Config::model, &MC::init_std, "model.init_std"),
                "standard deviation of the normal initialisation of weights"),
      model_key("model.norm_eps", 1e-5, above(0), kAll, {{"bert", 1e-12}},
                into(&Config::model, &MC::norm_eps, "model.norm_eps"),
                "epsilon of LayerNorm (gpt2, bert) or RMSNorm (llama)"),
      model_key("model.rope_theta", 10000.0, above(0), kLlama, no,
                into(&Config::model, &MC::rope_theta, "model.rope_theta"), "base of the rotary position frequencies"),
      model_key("model.dropout", 0.0, within(0, 1, true), kAll, {{"bert", 0.1}},
                into(&Config::model, &MC::dropout, "model.dropout"), "dropout on hidden states (gpt2 and llama: on attention probabilities too), training only"),
      model_key("model.attn_dropout", 0.0, within(0, 1, true), kBert, {{"bert", 0.1}},
                into(&Config::model, &MC::attn_dropout, "model.attn_dropout"),
                "dropout on attention probabilities, training only"),
      model_key("model.tie_embeddings", true, none(), kGpt2 | kLlama, {{"llama", false}},
                into(&Config::model, &MC::tie_embeddings, "model.tie_embeddings"),
                "the LM head shares the token embedding"),
      // data
      key("data.train", "", none(), "",
          "required: a token file or data set from llmpi-prep (DIR, DIR/train, DIR/train.h5; gpt2, llama) or a "
          "classification file (bert)",
          into(&Config::data, &DataConfig::train, "data.train")),
      key("data.val", "", none(), "",
          "optional validation split (DIR/val, a token file, or a classification file; \"\" = none)",
          into(&Config::data, &DataConfig::val, "data.val")),
      // train
      key("train.steps", 1000, at_least(0), "", "optimizer steps to run (ignored when train.epochs > 0)",
          into(&Config::train, &TC::steps, "train.steps")),
      key("train.epochs", 0, at_least(0, "(0 = run train.steps steps)"), "",
          "passes over the training data (0 = run train.steps); steps are derived and there is an evaluation at "
          "every epoch end",
          into(&Config::train, &TC::epochs, "train.epochs")),
      key("train.global_batch", 16, at_least(1), "",
          "sequences per step over all ranks, a multiple of the data-parallel replicas (or give "
          "train.batch_per_rank instead)",
          into(&Config::train, &TC::global_batch, "train.global_batch")),
      key("train.batch_per_rank", 0,
          at_least(0, "(sequences per data-parallel replica per step; 0 = train.global_batch is given)"), "",
          "sequences per step per data-parallel replica, instead of train.global_batch: the global batch is this x "
          "world / (pp_stages x tp) (weak scaling; 0 = use train.global_batch)",
          into(&Config::train, &TC::batch_per_rank, "train.batch_per_rank")),
      key("train.lr_scaling", "none", none(), "",
          "the peak rate follows the global batch: \"none\", \"linear\" (lr x global_batch / "
          "lr_reference_batch) or \"sqrt\"; the warm-up ramps to the scaled rate",
          into(&Config::train, &TC::lr_scaling, "train.lr_scaling", " (how the peak rate follows the global batch)")),
      key("train.lr_reference_batch", 0,
          at_least(0, "(the global batch train.lr is meant for; 0 = train.batch_per_rank)"),
          "train.lr_scaling linear or sqrt", "the global batch train.lr is meant for (0 = train.batch_per_rank)",
          into(&Config::train, &TC::lr_reference_batch, "train.lr_reference_batch"),
          unless([](const Config& c) { return c.train.lr_scaling != LrScaling::none; },
                 "with train.lr_scaling \"none\": it is the batch a scaled rate is scaled from (set "
                 "train.lr_scaling to \"linear\" or \"sqrt\" to use it)")),
      key("train.drop_last", true, none(), "train.epochs > 0",
          "false: an epoch's last partial batch is a shorter step; true: it is dropped",
          into(&Config::train, &TC::drop_last, "train.drop_last")),
      key("train.optimizer", "adamw", none(), "",
          "\"adamw\" (decoupled weight decay on 2-D weights only) or \"sgd\"",
          into(&Config::train, &TC::optimizer, "train.optimizer")),
      key("train.lr", 3e-4, at_least(0), "", "peak learning rate", into(&Config::train, &TC::lr, "train.lr")),
      key("train.lr_schedule", "cosine", none(), "", "decay after the warm-up: \"cosine\", \"linear\" or \"constant\"",
          into(&Config::train, &TC::lr_schedule, "train.lr_schedule")),
      key("train.min_lr_ratio", 0.1, within(0, 1, false), "", "the schedule decays to lr x min_lr_ratio",
          into(&Config::train, &TC::min_lr_ratio, "train.min_lr_ratio"),
          unless([](const Config& c) { return c.train.lr_schedule != LrSchedule::constant; },
                 "with train.lr_schedule \"constant\"")),
      key("train.warmup_steps", 0, at_least(0), "", "linear warm-up steps from 0 to lr",
          into(&Config::train, &TC::warmup_steps, "train.warmup_steps")),
      key("train.weight_decay", 0.1, at_least(0), "", "decoupled weight decay (never on biases or norm weights)",
          into(&Config::train, &TC::weight_decay, "train.weight_decay")),
      key("train.beta1", 0.9, within(0, 1, true), "train.optimizer adamw", "AdamW's first-moment decay",
          into(&Config::train, &TC::beta1, "train.beta1"), kAdamW),
      key("train.beta2", 0.95, within(0, 1, true), "train.optimizer adamw", "AdamW's second-moment decay",
          into(&Config::train, &TC::beta2, "train.beta2"), kAdamW),
      key("train.eps", 1e-8, above(0), "train.optimizer adamw", "AdamW's epsilon",
          into(&Config::train, &TC::eps, "train.eps"), kAdamW),
      key("train.grad_clip", 1.0, at_least(0, "(0 = no clipping)"), "",
          "clip the global gradient norm to this (0 = no clipping)", into(&Config::train, &TC::grad_clip, "train.grad_clip")),
      key("train.seed", 1337, none(), "", "seed of initialisation, shuffling and dropout",
          into(&Config::train, &TC::seed, "train.seed")),
      key("train.log_every", 10, at_least(1), "",
          "log a step to metrics.jsonl and the console every N steps (the first five always)",
          into(&Config::train, &TC::log_every, "train.log_every")),
      key("train.eval_every", 100, at_least(0, "(0 = evaluate only at the end)"), "data.val",
          "evaluate every N steps (0 = only at the end)", into(&Config::train, &TC::eval_every, "train.eval_every"),
          kWithVal),
      key("train.eval_batches", 8, at_least(0, "(0 = the whole validation file)"), "data.val",
          "global batches per evaluation (0 = the whole validation split)",
          into(&Config::train, &TC::eval_batches, "train.eval_batches"), kWithVal),
      key("train.on_nonfinite", "abort", none(), "",
          "a NaN/inf loss or gradient norm: \"abort\" stops with an error, \"skip\" leaves the parameters untouched "
          "for that step",
          into(&Config::train, &TC::on_nonfinite, "train.on_nonfinite")),
      key("train.max_consecutive_skips", 10,
          at_least(1, "(the non-finite steps in a row train.on_nonfinite=skip tolerates before the run stops)"),
          "train.on_nonfinite skip", "the run stops after this many non-finite steps in a row",
          into(&Config::train, &TC::max_consecutive_skips, "train.max_consecutive_skips"),
          unless([](const Config& c) { return c.train.on_nonfinite != OnNonfinite::abort; },
                 "with train.on_nonfinite \"abort\": the first non-finite step stops the run")),
      // parallel
      key("parallel.sync", "allreduce", none(), "",
          "gradient synchronisation: \"allreduce\", \"gather_scatter\" (through rank 0), \"weights\" (average "
          "parameters every average_every steps) or \"nccl\" (CUDA backend)",
          into(&Config::parallel, &PC::sync, "parallel.sync")),
      key("parallel.bucket_mb", 25.0, at_least(0, "(0 = one collective per tensor)"), "",
          "size of a gradient bucket, one collective each (0 = one per tensor; huge = one for the whole gradient)",
          into(&Config::parallel, &PC::bucket_mb, "parallel.bucket_mb")),
      key("parallel.first_bucket_mb", 1.0, above(0), "parallel.overlap", "size of the first bucket backward finishes",
          into(&Config::parallel, &PC::first_bucket_mb, "parallel.first_bucket_mb"),
          unless([](const Config& c) { return c.parallel.overlap; },
                 "without parallel.overlap=true: the small first bucket only helps when buckets are reduced during "
                 "backward")),
      key("parallel.overlap", false, none(), "",
          "reduce each bucket on a communication thread while backward goes on (needs MPI_THREAD_MULTIPLE)",
          into(&Config::parallel, &PC::overlap, "parallel.overlap")),
      key("parallel.poll_us", 50, at_least(0, "(0 = blocking collectives)"), "parallel.overlap",
          "sleep between MPI_Test polls of the communication thread (0 = blocking collectives)",
          into(&Config::parallel, &PC::poll_us, "parallel.poll_us"),
          unless([](const Config& c) { return c.parallel.overlap; },
                 "without parallel.overlap=true: it paces the communication thread")),
      key("parallel.average_every", 1, at_least(1), "parallel.sync weights", "steps between parameter averages",
          into(&Config::parallel, &PC::average_every, "parallel.average_every"),
          [](const Config& c) {
            return c.parallel.sync == SyncMethod::weights
                       ? std::string()
                       : std::string("with parallel.sync \"") + option_name(c.parallel.sync) +
                             "\": only \"weights\" averages parameters";
          }),
      key("parallel.pp_stages", 1, at_least(1, "(1 = no pipeline)"), "",
          "pipeline stages (1 = no pipeline); the world size must be a multiple",
          into(&Config::parallel, &PC::pp_stages, "parallel.pp_stages")),
      key("parallel.sequence_parallel", false, none(), "parallel.tp > 1",
          "sequence parallelism: norms, residual adds and hidden dropout on each tensor-parallel rank's rows of a "
          "micro-batch (all-gather / reduce-scatter instead of all-reduce); model.seq_len a multiple of tp",
          into(&Config::parallel, &PC::sequence_parallel, "parallel.sequence_parallel"),
          unless([](const Config& c) { return c.parallel.tp > 1; },
                 "with parallel.tp 1: it splits the rows of a tensor-parallel group (set parallel.tp > 1)")),
      key("parallel.tp", 1, at_least(1, "(1 = no tensor parallelism)"), "",
          "tensor-parallel ranks sharing each layer (Megatron's split of heads, MLP channels and vocabulary; 1 = "
          "none); adjacent ranks; the world size must be a multiple of pp_stages × tp",
          into(&Config::parallel, &PC::tp, "parallel.tp")),
      key("parallel.microbatches", 1, at_least(1), "",
          "a pipeline's micro-batches per step; with pp_stages 1, gradient accumulation: micro-batches per step, "
          "one gradient sync",
          into(&Config::parallel, &PC::microbatches, "parallel.microbatches")),
      key("parallel.schedule", "1f1b", none(), "parallel.pp_stages > 1",
          "pipeline schedule: \"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\"",
          into(&Config::parallel, &PC::schedule, "parallel.schedule"), kPipelineOnly),
      key("parallel.virtual_stages", 1, at_least(1), "parallel.pp_stages > 1",
          "model chunks per stage of the interleaved schedule (1 = not interleaved)",
          into(&Config::parallel, &PC::virtual_stages, "parallel.virtual_stages"), kPipelineOnly),
      key("parallel.stage_layers", json::array(), none(), "parallel.pp_stages > 1",
          "layers of each (virtual) stage, e.g. [1,3] ([] = balanced by estimated cost)",
          into(&Config::parallel, &PC::stage_layers, "parallel.stage_layers"), kPipelineOnly),
      key("parallel.zero", 0, none(), "",
          "1 = ZeRO-1: each data-parallel rank keeps the optimizer state of its shard only; 2 = ZeRO-2: and only "
          "its pieces of the gradient; 3 = ZeRO-3 (FSDP): and of the blocks' parameters",
          [](Config& c, const json& v) {
            const int zero = as_int<int>(v, "parallel.zero");
            if (zero < 0 || zero > 3)
              fail("config: 'parallel.zero' must be 0 (every rank keeps the whole optimizer state), 1 (ZeRO-1: "
                   "each data-parallel rank keeps the AdamW moments of its 1/DP shard), 2 (ZeRO-2: and only its "
                   "1/DP pieces of the gradient) or 3 (ZeRO-3: and of the blocks' parameters), got ", zero);
            c.parallel.zero = zero;
          }),
      key("parallel.zero_reduce", "micro_batch", none(), "parallel.zero 2 or 3 with parallel.microbatches > 1",
          "with gradient accumulation, ZeRO-2/3 reduce-scatter each micro-batch's gradient as its backward "
          "finishes it (\"micro_batch\": the gradient stays 1/DP, at M times the traffic) or the whole "
          "gradient once after the last micro-batch (\"step\": ZeRO-1's traffic, the whole gradient until then)",
          into(&Config::parallel, &PC::zero_reduce, "parallel.zero_reduce", " (when ZeRO-2/3 reduce the gradient)"),
          unless([](const Config& c) { return c.parallel.zero >= 2 && c.parallel.microbatches > 1 &&
                                              c.parallel.pp_stages == 1; },
                 "without gradient accumulation under ZeRO-2/3 (parallel.zero 2 or 3, parallel.microbatches > 1, "
                 "parallel.pp_stages 1): with pipeline stages the gradient is reduced once per step")),
      key("parallel.grad_dtype", "fp32", none(), "parallel.sync allreduce or nccl",
          "the gradient on the wire: \"fp32\" or \"bf16\" (half the bytes, rounded sums)",
          into(&Config::parallel, &PC::grad_dtype, "parallel.grad_dtype", " (the gradient's type on the wire)")),
      // runtime
      key("runtime.device", "auto", none(), "", "\"auto\" (CUDA when every rank has a GPU, else CPU), \"cpu\" or \"cuda\"",
          into(&Config::runtime, &RC::device, "runtime.device")),
      key("runtime.precision", "fp32", none(), "",
          "the dense layers' GEMMs: \"fp32\", \"bf16\" (operands rounded to bf16, fp32 accumulation) or \"tf32\" "
          "(CUDA only); everything else stays fp32",
          into(&Config::runtime, &RC::precision, "runtime.precision", " (the dense layers' GEMMs; tf32 only on CUDA)")),
      key("runtime.cpu_bf16_gemm", "auto", none(), "runtime.precision bf16 on the CPU",
          "\"auto\" (onednn where it takes at most 95% of emulate's time on the run's own GEMMs, timed at start-up, "
          "else emulate; a resumed run keeps its checkpoint's), \"onednn\" (oneDNN's bf16 matmul) or \"emulate\" "
          "(operands rounded to bf16, then an fp32 sgemm: the exact oracle)",
          into(&Config::runtime, &RC::cpu_bf16_gemm, "runtime.cpu_bf16_gemm", " (the CPU's bf16 GEMMs)"),
          [](const Config& c) {
            if (c.runtime.precision != GemmPrecision::bf16)
              return std::string("with runtime.precision \"") + option_name(c.runtime.precision) +
                     "\": it picks the CPU's bf16 GEMM engine";
            if (c.runtime.device == DeviceChoice::cuda)
              return std::string("with runtime.device \"cuda\": it picks the CPU's bf16 GEMM engine");
            return std::string();
          }),
      key("runtime.cpu_fp32_gemm", "auto", none(), "runtime.precision fp32 on the CPU",
          "\"auto\" (onednn where it takes at most 95% of openblas's time on the run's own GEMMs, timed at start-up, "
          "else openblas; a resumed run keeps its checkpoint's), \"onednn\" (oneDNN's fp32 matmul) or \"openblas\" "
          "(sgemm); the two agree up to the order of the fp32 sums",
          into(&Config::runtime, &RC::cpu_fp32_gemm, "runtime.cpu_fp32_gemm", " (the CPU's fp32 GEMMs)"),
          unless([](const Config& c) { return c.runtime.device != DeviceChoice::cuda; },
                 "with runtime.device \"cuda\": it picks the CPU's fp32 GEMM engine")),
      key("runtime.recompute", "none", none(), "",
          "activation recomputation in backward: \"none\", \"selective\" (MLP activations, full attention's "
          "probabilities, norm outputs) or \"full\" (each block's forward again); the same bits, less memory; "
          "not with schedule zb-h1",
          into(&Config::runtime, &RC::recompute, "runtime.recompute", " (activation recomputation in backward)")),
      key("runtime.attention", "auto", none(), "",
          "\"auto\" (fused on CUDA for head sizes <= 128, else full), \"full\" (keeps the T x T probabilities of "
          "every layer) or \"fused\" (one log-sum-exp per query row, never a T x T matrix)",
          into(&Config::runtime, &RC::attention, "runtime.attention")),
      key("runtime.threads", 0, at_least(0, "(0 = cores / ranks per node)"), "",
          "OpenMP/OpenBLAS threads per rank (0 = cores / ranks on the node)",
          into(&Config::runtime, &RC::threads, "runtime.threads")),
      key("runtime.trace_steps", 20, at_least(0, "(0 = no trace)"), "",
          "per-rank Chrome trace (trace-rank{N}.json) of the first N steps (0 = off)",
          into(&Config::runtime, &RC::trace_steps, "runtime.trace_steps")),
      key("runtime.step_timeout_s", 0.0, at_least(0, "(0 = no limit)"), "",
          "abort a step that spends longer than this in one phase, naming the step and phase (0 = off)",
          into(&Config::runtime, &RC::step_timeout_s, "runtime.step_timeout_s")),
      key("runtime.memory_check", true, none(), "",
          "refuse at start-up a configuration whose memory estimate does not fit the node",
          into(&Config::runtime, &RC::memory_check, "runtime.memory_check")),
      key("runtime.lm_head_chunk_rows", 0,
          at_least(0, "(rows per chunk of the LM head; 0 = as many as fit 256 MiB of logits)"), "",
          "rows per chunk of the LM head, which never stores all N x V logits (0 = as many as fit 256 MiB of fp32 "
          "logits)",
          into(&Config::runtime, &RC::lm_head_chunk_rows, "runtime.lm_head_chunk_rows"),
          unless([](const Config& c) { return c.model.family != Family::bert; },
                 "with model.family \"bert\": a classifier has no language-model head")),
      // run, checkpoint
      key("run.dir", "runs/default", none(), "",
          "the run directory: config.json, metrics.jsonl, eval.jsonl, checkpoints/, traces",
          into(&Config::run, &RunConfig::dir, "run.dir")),
      key("metrics.tensorboard", true, none(), "",
          "write TensorBoard event files (run.dir/events.out.tfevents.*): rank 0's loss, learning rate, gradient "
          "norm, tokens/s, step time, model TFLOP/s per rank, peak RSS and the evaluation, at every logged step; "
          "`tensorboard --logdir` on run.dir or its parent shows them",
          into(&Config::metrics, &MetricsConfig::tensorboard, "metrics.tensorboard")),
      key("checkpoint.every", 0, at_least(0, "(0 = only at pre-emption)"), "",
          "write a checkpoint every N steps and at the end (0 = only when the run is pre-empted)",
          into(&Config::checkpoint, &CheckpointConfig::every, "checkpoint.every")),
      key("checkpoint.keep", 3, at_least(1), "", "keep the newest N checkpoints of this run",
          into(&Config::checkpoint, &CheckpointConfig::keep, "checkpoint.keep")),
      key("checkpoint.async", true, none(), "",
          "true: a checkpoint's values are copied to host memory and written while training goes on (the next "
          "checkpoint, a pre-emption or the end of the run waits for it); false: the step waits for the write",
          into(&Config::checkpoint, &CheckpointConfig::async, "checkpoint.async")),
  };
}

// A number as the table's messages write it: an integer without a fraction.
std::string number(double x) {
  char b[32];
  if (x == std::trunc(x) && std::fabs(x) < 1e15) std::snprintf(b, sizeof b, "%.0f", x);
  else std::snprintf(b, sizeof b, "%g", x);
  return b;
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = make_keys();
  return keys;
}

const ConfigKey* find_config_key(const std::string& key) {
  for (const ConfigKey& k : config_keys())
    if (key == k.key) return &k;
  return nullptr;
}

void check_key_range(const ConfigKey& k, const json& v) {
  const KeyRange& r = k.range;
  if (!r.any() || !v.is_number()) return;
  const double x = v.get<double>();
  const bool has_lo = r.lo == r.lo, has_hi = r.hi == r.hi;
  const bool ok = (!has_lo || (r.lo_open ? x > r.lo : x >= r.lo)) && (!has_hi || (r.hi_open ? x < r.hi : x <= r.hi));
  if (ok) return;
  std::string range;
  if (has_lo && has_hi && k.def.is_number_integer() && !r.lo_open && !r.hi_open)
    range = "in " + number(r.lo) + ".." + number(r.hi);
  else if (has_lo && has_hi)
    range = std::string("in ") + (r.lo_open ? "(" : "[") + number(r.lo) + ", " + number(r.hi) + (r.hi_open ? ")" : "]");
  else if (has_lo)
    range = std::string(r.lo_open ? "> " : ">= ") + number(r.lo);
  else
    range = std::string(r.hi_open ? "< " : "<= ") + number(r.hi);
  fail("config: '", k.key, "' must be ", range, *r.note ? " " : "", r.note, ", got ", v.dump());
}

namespace {

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

// Every key, in the table's order (model, data, train, parallel, runtime, run, checkpoint).
std::vector<std::pair<std::string, std::string>> keys_in_order() {  // (section, key)
  std::vector<std::pair<std::string, std::string>> keys;
  for (const ConfigKey& k : config_keys()) keys.emplace_back(k.section(), k.name());
  return keys;
}

std::string description_of(const std::string& key) {
  const ConfigKey* k = find_config_key(key);
  return k && *k->description ? k->description : "(no description: add one in src/runtime/config_keys.cpp)";
}

}  // namespace

std::vector<std::string> config_key_docs_missing() {
  std::vector<std::string> missing;
  std::set<std::string> declared;
  for (const ConfigKey& k : config_keys()) {
    if (!*k.description) missing.push_back(std::string(k.key) + ": no description");
    if (!declared.insert(k.key).second) missing.push_back(std::string(k.key) + ": declared twice");
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
    const ConfigKey* d = find_config_key(sec + "." + k);
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
    } else if (const ConfigKey* d = find_config_key(key)) {
      acts = d->acts;
    }
    s += "| `" + key + "` | " + def + " | " + cell(acts) + " | " + cell(description_of(key)) + " |\n";
  }
  return s;
}

}  // namespace llmpi
