#include "runtime/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "runtime/error.h"

namespace llmpi {

using nlohmann::json;

const json& config_defaults() {
  static const json d = json::parse(R"({
    "model":    {"family": "gpt2", "n_layer": 4, "n_head": 4, "n_kv_head": 0, "d_model": 256,
                 "ffn_dim": 0, "seq_len": 256, "max_seq_len": 0, "vocab_size": 0, "num_labels": 2,
                 "type_vocab_size": 2, "init_std": 0.02, "norm_eps": 1e-5, "rope_theta": 10000.0,
                 "dropout": 0.0, "attn_dropout": 0.0, "tie_embeddings": true},
    "data":     {"train": "", "val": ""},
    "train":    {"steps": 1000, "epochs": 0, "global_batch": 16, "batch_per_rank": 0, "drop_last": true,
                 "lr": 3e-4, "lr_scaling": "none", "lr_reference_batch": 0, "lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 0, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
                 "eps": 1e-8, "optimizer": "adamw", "grad_clip": 1.0, "seed": 1337, "log_every": 10,
                 "eval_every": 100, "eval_batches": 8, "on_nonfinite": "abort",
                 "max_consecutive_skips": 10},
    "parallel": {"sync": "allreduce", "bucket_mb": 25.0, "first_bucket_mb": 1.0, "overlap": false,
                 "poll_us": 50, "average_every": 1, "pp_stages": 1, "tp": 1, "sequence_parallel": false, "microbatches": 1,
                 "schedule": "1f1b", "virtual_stages": 1, "stage_layers": [], "zero": 0,
                 "grad_dtype": "fp32"},
    "runtime":  {"device": "auto", "precision": "fp32", "cpu_bf16_gemm": "auto", "cpu_fp32_gemm": "auto",
                 "attention": "auto", "recompute": "none", "threads": 0, "trace_steps": 20,
                 "step_timeout_s": 0.0, "memory_check": true, "lm_head_chunk_rows": 0},
    "run":      {"dir": "runs/default"},
    "checkpoint": {"every": 0, "keep": 3, "async": true}
  })");
  return d;
}

// Which model.* keys each family takes, and its defaults where they differ from the document's.
json family_model_defaults(const std::string& family) {
  static const std::vector<std::string> common = {"family", "n_layer", "n_head", "d_model", "ffn_dim", "seq_len",
                                                  "max_seq_len", "vocab_size", "init_std", "norm_eps", "dropout"};
  Family f{};
  if (!parse_option(family, &f))
    fail("config: 'model.family' must be ", option_words<Family>(), ", got \"", family, "\"");
  std::vector<std::string> keys = common;
  json over = json::object();
  switch (f) {
    case Family::gpt2:
      keys.push_back("tie_embeddings");
      break;
    case Family::llama:
      keys.insert(keys.end(), {"n_kv_head", "rope_theta", "tie_embeddings"});
      over = {{"tie_embeddings", false}};
      break;
    case Family::bert:
      keys.insert(keys.end(), {"attn_dropout", "num_labels", "type_vocab_size"});
      over = {{"norm_eps", 1e-12}, {"dropout", 0.1}, {"attn_dropout", 0.1}};
      break;
  }
  json m = json::object();
  for (auto& k : keys) m[k] = over.contains(k) ? over[k] : config_defaults()["model"][k];
  m["family"] = family;
  return m;
}

// Edit distance with adjacent transpositions counted as one edit (optimal string alignment), for
// "did you mean" suggestions: "setps" is one edit from "steps".
static size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); i++) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); j++) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); i++)
    for (size_t j = 1; j <= b.size(); j++) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The closest of `candidates` to `word`, as " (did you mean 'x'?)", or a pointer to --help.
static std::string suggestion_among(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 1000;
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (best_d <= std::max<size_t>(2, word.size() / 3)) return " (did you mean '" + best + "'?)";
  return " (valid keys: see `llmpi-train --help`)";
}

// For an unknown "section.key": the nearest key of that section when the section exists, else the
// nearest full key path.
static std::string suggestion(const std::string& path) {
  auto dot = path.find('.');
  std::string sec = path.substr(0, dot);
  std::vector<std::string> keys;
  if (dot != std::string::npos && config_defaults().contains(sec)) {
    for (auto& [k, v] : config_defaults()[sec].items()) keys.push_back(sec + "." + k);
  } else {
    for (auto& [s, obj] : config_defaults().items())
      for (auto& [k, v] : obj.items()) keys.push_back(s + "." + k);
  }
  return suggestion_among(path, keys);
}

static std::string section_suggestion(const std::string& sec) {
  std::vector<std::string> secs;
  for (auto& [s, obj] : config_defaults().items()) secs.push_back(s);
  return suggestion_among(sec, secs);
}

static const char* type_name(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return "null";
}

// Check that `value` may stand where the default `def` stands: integers for integers, any number
// for floating-point values, strings for strings.
static void check_type(const std::string& path, const json& value, const json& def,
                       const std::string& source) {
  bool ok = false;
  if (def.is_number_integer() || def.is_number_unsigned()) {
    ok = value.is_number_integer() || value.is_number_unsigned();
    if (!ok && value.is_number_float()) {  // 1e3 and 4.0 are fine where they are whole numbers
      double d = value.get<double>();
      ok = std::isfinite(d) && d == std::trunc(d);  // its range is checked by as_int when read
    }
  } else if (def.is_number_float()) {
    ok = value.is_number();
  } else if (def.is_string()) {
    ok = value.is_string();
  } else if (def.is_boolean()) {
    ok = value.is_boolean();
  } else if (def.is_array()) {  // a list of integers (parallel.stage_layers)
    ok = value.is_array();
    for (const json& e : value) ok = ok && (e.is_number_integer() || e.is_number_unsigned());
  }
  if (!ok)
    fail(source, ": '", path, "' must be ", type_name(def), " (like ", def.dump(), "), got ",
         type_name(value), " ", value.dump());
}

static void merge_user(json& resolved, const json& user, const std::string& source, std::vector<std::string>& given) {
  if (!user.is_object()) fail(source, ": the configuration must be a JSON object {...}");
  for (auto& [sec, obj] : user.items()) {
    if (!config_defaults().contains(sec))
      fail(source, ": unknown section '", sec, "'", section_suggestion(sec));
    if (!obj.is_object())
      fail(source, ": '", sec, "' must be an object of keys, like ", config_defaults()[sec].dump());
    for (auto& [k, v] : obj.items()) {
      std::string path = sec + "." + k;
      if (!config_defaults()[sec].contains(k)) fail(source, ": unknown key '", path, "'", suggestion(path));
      check_type(path, v, config_defaults()[sec][k], source);
      resolved[sec][k] = v;
      given.push_back(path);
    }
  }
}

static void apply_override(json& resolved, const std::string& assignment, std::vector<std::string>& given) {
  auto eq = assignment.find('=');
  auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    fail("--set '", assignment, "': expected key.path=value, e.g. --set train.lr=1e-3");
  std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  std::string sec = path.substr(0, dot), key = path.substr(dot + 1);
  if (!config_defaults().contains(sec) || !config_defaults()[sec].contains(key))
    fail("--set: unknown key '", path, "'", suggestion(path));
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {  // a bare string: --set run.dir=out/x
    value = text;
    // It goes into config.json (and into messages) as a JSON string, which must be UTF-8.
    try {
      (void)value.dump();
    } catch (const json::type_error&) {
      fail("--set '", path, "=...': the value is not valid UTF-8 text; give it as UTF-8");
    }
  }
  check_type(path, value, config_defaults()[sec][key], "--set");
  resolved[sec][key] = value;
  given.push_back(path);
}

static void require(bool ok, const std::string& path, const std::string& why) {
  if (!ok) fail("config: '", path, "' ", why);
}

// The integer at `path` as T, which must hold it exactly (4.0 and 1e3 are 4 and 1000): a value
// outside T's range is an error, never wrapped or clamped.
template <typename T>
static T as_int(const json& v, const char* path) {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  bool ok;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= uint64_t(hi);
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    ok = i >= 0 ? uint64_t(i) <= uint64_t(hi) : std::is_signed<T>::value && i >= int64_t(lo);
  } else {
    double d = v.get<double>();  // whole (check_type); hi + 1.0 is a power of two, exact
    ok = d >= double(lo) && d < double(hi) + 1.0;
  }
  if (!ok) fail("config: '", path, "' must be an integer in ", +lo, "..", +hi, ", got ", v.dump());
  return v.get<T>();
}

// The enum for the word at `path`; an unknown word is an error listing the valid ones (and `note`).
template <typename E>
static E as_option(const json& v, const char* path, const char* note = "") {
  E e{};
  const std::string word = v.get<std::string>();
  if (!parse_option(word, &e))
    fail("config: '", path, "' must be ", option_words<E>(), note, ", got \"", word, "\"");
  return e;
}

static Config extract(const json& r) {
  Config c;
  c.resolved = r;
  // Keys a family does not take read as the document's defaults (they are not used).
  json m = config_defaults()["model"];
  for (auto& [k, v] : r["model"].items()) m[k] = v;
  c.model.family = as_option<Family>(m["family"], "model.family");
  c.model.n_layer = as_int<int>(m["n_layer"], "model.n_layer");
  c.model.n_head = as_int<int>(m["n_head"], "model.n_head");
  c.model.n_kv_head = as_int<int>(m["n_kv_head"], "model.n_kv_head");
  c.model.d_model = as_int<int>(m["d_model"], "model.d_model");
  c.model.ffn_dim = as_int<int>(m["ffn_dim"], "model.ffn_dim");
  c.model.seq_len = as_int<int>(m["seq_len"], "model.seq_len");
  c.model.max_seq_len = as_int<int>(m["max_seq_len"], "model.max_seq_len");
  c.model.vocab_size = as_int<int>(m["vocab_size"], "model.vocab_size");
  c.model.num_labels = as_int<int>(m["num_labels"], "model.num_labels");
  c.model.type_vocab_size = as_int<int>(m["type_vocab_size"], "model.type_vocab_size");
  c.model.init_std = m["init_std"];
  c.model.norm_eps = m["norm_eps"];
  c.model.rope_theta = m["rope_theta"];
  c.model.dropout = m["dropout"];
  c.model.attn_dropout = m["attn_dropout"];
  c.model.tie_embeddings = m["tie_embeddings"];
  c.data = {r["data"]["train"], r["data"]["val"]};
  auto& t = r["train"];
  c.train.steps = as_int<int64_t>(t["steps"], "train.steps");
  c.train.epochs = as_int<int>(t["epochs"], "train.epochs");
  c.train.drop_last = t["drop_last"];
  c.train.lr_schedule = as_option<LrSchedule>(t["lr_schedule"], "train.lr_schedule");
  c.train.global_batch = as_int<int>(t["global_batch"], "train.global_batch");
  c.train.batch_per_rank = as_int<int>(t["batch_per_rank"], "train.batch_per_rank");
  c.train.lr = t["lr"];
  c.train.lr_scaling = as_option<LrScaling>(t["lr_scaling"], "train.lr_scaling",
                                            " (how the peak rate follows the global batch)");
  c.train.lr_reference_batch = as_int<int>(t["lr_reference_batch"], "train.lr_reference_batch");
  c.train.min_lr_ratio = t["min_lr_ratio"];
  c.train.warmup_steps = as_int<int64_t>(t["warmup_steps"], "train.warmup_steps");
  c.train.weight_decay = t["weight_decay"];
  c.train.beta1 = t["beta1"];
  c.train.beta2 = t["beta2"];
  c.train.eps = t["eps"];
  c.train.grad_clip = t["grad_clip"];
  c.train.seed = as_int<uint64_t>(t["seed"], "train.seed");
  c.train.log_every = as_int<int64_t>(t["log_every"], "train.log_every");
  c.train.eval_every = as_int<int64_t>(t["eval_every"], "train.eval_every");
  c.train.eval_batches = as_int<int>(t["eval_batches"], "train.eval_batches");
  c.train.optimizer = as_option<OptimizerKind>(t["optimizer"], "train.optimizer");
  auto& p = r["parallel"];
  c.parallel.sync = as_option<SyncMethod>(p["sync"], "parallel.sync");
  c.parallel.bucket_mb = p["bucket_mb"];
  c.parallel.first_bucket_mb = p["first_bucket_mb"];
  c.parallel.overlap = p["overlap"];
  c.parallel.poll_us = as_int<int>(p["poll_us"], "parallel.poll_us");
  c.parallel.average_every = as_int<int>(p["average_every"], "parallel.average_every");
  c.parallel.pp_stages = as_int<int>(p["pp_stages"], "parallel.pp_stages");
  c.parallel.microbatches = as_int<int>(p["microbatches"], "parallel.microbatches");
  c.parallel.tp = as_int<int>(p["tp"], "parallel.tp");
  c.parallel.sequence_parallel = p["sequence_parallel"];
  c.parallel.schedule = as_option<ScheduleKind>(p["schedule"], "parallel.schedule");
  const int zero = as_int<int>(p["zero"], "parallel.zero");
  require(zero == 0 || zero == 1, "parallel.zero",
          "must be 0 (every rank keeps the whole optimizer state) or 1 (ZeRO-1: each data-parallel rank keeps "
          "the AdamW moments of its 1/DP shard), got " + std::to_string(zero));
  c.parallel.zero = zero == 1;
  c.parallel.grad_dtype = as_option<GradDtype>(p["grad_dtype"], "parallel.grad_dtype", " (the gradient's type on the wire)");
  c.parallel.virtual_stages = as_int<int>(p["virtual_stages"], "parallel.virtual_stages");
  for (const json& e : p["stage_layers"]) c.parallel.stage_layers.push_back(as_int<int>(e, "parallel.stage_layers"));
  c.runtime.trace_steps = as_int<int>(r["runtime"]["trace_steps"], "runtime.trace_steps");
  c.runtime.step_timeout_s = r["runtime"]["step_timeout_s"];
  c.runtime.memory_check = r["runtime"]["memory_check"];
  c.train.on_nonfinite = as_option<OnNonfinite>(t["on_nonfinite"], "train.on_nonfinite");
  c.train.max_consecutive_skips = as_int<int>(t["max_consecutive_skips"], "train.max_consecutive_skips");
  c.checkpoint.every = as_int<int64_t>(r["checkpoint"]["every"], "checkpoint.every");
  c.checkpoint.keep = as_int<int>(r["checkpoint"]["keep"], "checkpoint.keep");
  c.checkpoint.async = r["checkpoint"]["async"];
  c.runtime.device = as_option<DeviceChoice>(r["runtime"]["device"], "runtime.device");
  c.runtime.precision = as_option<GemmPrecision>(r["runtime"]["precision"], "runtime.precision",
                                                " (the dense layers' GEMMs; tf32 only on CUDA)");
  c.runtime.attention = as_option<AttentionChoice>(r["runtime"]["attention"], "runtime.attention");
  c.runtime.recompute = as_option<Recompute>(r["runtime"]["recompute"], "runtime.recompute",
                                             " (activation recomputation in backward)");
  c.runtime.cpu_bf16_gemm = as_option<CpuBf16Gemm>(r["runtime"]["cpu_bf16_gemm"], "runtime.cpu_bf16_gemm",
                                                  " (the CPU's bf16 GEMMs)");
  c.runtime.cpu_fp32_gemm = as_option<CpuFp32Gemm>(r["runtime"]["cpu_fp32_gemm"], "runtime.cpu_fp32_gemm",
                                                  " (the CPU's fp32 GEMMs)");
  c.runtime.threads = as_int<int>(r["runtime"]["threads"], "runtime.threads");
  c.runtime.lm_head_chunk_rows = as_int<int>(r["runtime"]["lm_head_chunk_rows"], "runtime.lm_head_chunk_rows");
  c.run.dir = r["run"]["dir"];

  require(c.model.n_layer >= 1 && c.model.n_layer <= kMaxLayers, "model.n_layer",
          "must be in 1.." + std::to_string(kMaxLayers) + " (transformer blocks; the deepest models trained have a "
          "few hundred), got " + std::to_string(c.model.n_layer) + ": choose fewer layers");
  require(c.model.n_head >= 1, "model.n_head", "must be >= 1");
  require(c.model.d_model >= 1 && c.model.d_model % c.model.n_head == 0, "model.d_model",
          "must be a positive multiple of model.n_head (" + std::to_string(c.model.n_head) + "), got " +
              std::to_string(c.model.d_model));
  require(c.model.seq_len >= 1, "model.seq_len", "must be >= 1");
  require(c.model.vocab_size >= 0, "model.vocab_size", "must be >= 0 (0 = from the training file)");
  require(c.model.init_std > 0, "model.init_std", "must be > 0");
  require(c.model.n_kv_head >= 0, "model.n_kv_head", "must be >= 0 (0 = n_head)");
  if (c.model.family == Family::llama) {
    if (c.model.n_kv_head > 0 && c.model.n_head % c.model.n_kv_head != 0)
      fail("config: 'model.n_kv_head' (", c.model.n_kv_head, ") must divide 'model.n_head' (", c.model.n_head,
           "): every key/value head serves the same number of query heads");
    require((c.model.d_model / c.model.n_head) % 2 == 0, "model.d_model",
            "/ model.n_head must be even for rotary positions (llama), got " +
                std::to_string(c.model.d_model / c.model.n_head));
  }
  require(c.model.ffn_dim >= 0, "model.ffn_dim", "must be >= 0 (0 = the family's default)");
  require(c.model.max_seq_len >= 0, "model.max_seq_len", "must be >= 0 (0 = seq_len)");
  require(c.model.num_labels >= 1, "model.num_labels", "must be >= 1");
  require(c.model.type_vocab_size >= 1, "model.type_vocab_size", "must be >= 1");
  require(c.model.norm_eps > 0, "model.norm_eps", "must be > 0");
  require(c.model.rope_theta > 0, "model.rope_theta", "must be > 0");
  require(c.model.dropout >= 0 && c.model.dropout < 1, "model.dropout", "must be in [0, 1)");
  require(c.model.attn_dropout >= 0 && c.model.attn_dropout < 1, "model.attn_dropout", "must be in [0, 1)");
  require(!c.data.train.empty(), "data.train",
          "is required: the path of a token file made by llmpi-prep (e.g. --set data.train=out/train.h5)");
  require(c.train.steps >= 0, "train.steps", "must be >= 0");
  require(c.train.global_batch >= 1, "train.global_batch", "must be >= 1");
  require(c.train.batch_per_rank >= 0, "train.batch_per_rank",
          "must be >= 0 (sequences per data-parallel replica per step; 0 = train.global_batch is given)");
  require(c.train.lr >= 0, "train.lr", "must be >= 0");
  require(c.train.lr_reference_batch >= 0, "train.lr_reference_batch",
          "must be >= 0 (the global batch train.lr is meant for; 0 = train.batch_per_rank)");
  if (c.train.lr_scaling != LrScaling::none && c.train.lr_reference_batch == 0 && c.train.batch_per_rank == 0)
    fail("config: 'train.lr_scaling' \"", option_name(c.train.lr_scaling), "\" scales train.lr from the batch it is "
         "meant for, which nothing names: set train.lr_reference_batch to that global batch (or give the batch as "
         "train.batch_per_rank, which is then the reference)");
  require(c.train.min_lr_ratio >= 0 && c.train.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]");
  require(c.train.warmup_steps >= 0, "train.warmup_steps", "must be >= 0");
  require(c.train.weight_decay >= 0, "train.weight_decay", "must be >= 0");
  require(c.train.beta1 >= 0 && c.train.beta1 < 1, "train.beta1", "must be in [0, 1)");
  require(c.train.beta2 >= 0 && c.train.beta2 < 1, "train.beta2", "must be in [0, 1)");
  require(c.train.eps > 0, "train.eps", "must be > 0");
  require(c.train.grad_clip >= 0, "train.grad_clip", "must be >= 0 (0 = no clipping)");
  require(c.train.log_every >= 1, "train.log_every", "must be >= 1");
  require(c.train.eval_every >= 0, "train.eval_every", "must be >= 0 (0 = evaluate only at the end)");
  require(c.train.eval_batches >= 0, "train.eval_batches", "must be >= 0 (0 = the whole validation file)");
  require(c.train.epochs >= 0, "train.epochs", "must be >= 0 (0 = run train.steps steps)");
  require(c.parallel.bucket_mb >= 0, "parallel.bucket_mb", "must be >= 0 (0 = one collective per tensor)");
  require(c.parallel.first_bucket_mb > 0, "parallel.first_bucket_mb", "must be > 0");
  require(c.parallel.poll_us >= 0, "parallel.poll_us", "must be >= 0 (0 = blocking collectives)");
  require(c.parallel.average_every >= 1, "parallel.average_every", "must be >= 1");
  require(c.parallel.pp_stages >= 1, "parallel.pp_stages", "must be >= 1 (1 = no pipeline)");
  require(c.parallel.tp >= 1, "parallel.tp", "must be >= 1 (1 = no tensor parallelism)");
  if (c.parallel.sequence_parallel && c.parallel.tp > 1) {
    require(c.model.seq_len % c.parallel.tp == 0, "parallel.sequence_parallel",
            "splits each micro-batch's rows over the parallel.tp ranks: model.seq_len (" +
                std::to_string(c.model.seq_len) + ") must be a multiple of parallel.tp (" +
                std::to_string(c.parallel.tp) + ")");
    require(!(c.parallel.pp_stages > 1 && c.parallel.schedule == ScheduleKind::zb_h1), "parallel.sequence_parallel",
            "does not combine with parallel.schedule \"zb-h1\" (its deferred weight gradients would read branch "
            "inputs gathered again for every layer): use \"1f1b\" or \"interleaved\"");
  }
  const std::string sync_error = sync_choice_error(c.parallel.sync, c.parallel.zero, c.parallel.grad_dtype,
                                                   c.parallel.overlap);
  if (!sync_error.empty()) fail(sync_error);
  const std::string recompute_error = recompute_schedule_error(c.runtime.recompute, c.parallel.schedule,
                                                               c.parallel.pp_stages);
  if (!recompute_error.empty()) fail(recompute_error);
  require(c.parallel.microbatches >= 1, "parallel.microbatches", "must be >= 1");
  require(c.parallel.virtual_stages >= 1, "parallel.virtual_stages", "must be >= 1");
  for (int n : c.parallel.stage_layers)
    require(n >= 0, "parallel.stage_layers", "must list layer counts >= 0, one per (virtual) stage");
  if (c.runtime.device == DeviceChoice::cpu) {  // explicit; an automatic choice is checked when resolved
    const std::string e = precision_device_error(c.runtime.precision, c.runtime.device, false);
    if (!e.empty()) fail(e);
  }
  require(c.runtime.threads >= 0, "runtime.threads", "must be >= 0 (0 = cores / ranks per node)");
  require(c.runtime.lm_head_chunk_rows >= 0, "runtime.lm_head_chunk_rows",
          "must be >= 0 (rows per chunk of the LM head; 0 = as many as fit 256 MiB of logits)");
  require(c.runtime.trace_steps >= 0, "runtime.trace_steps", "must be >= 0 (0 = no trace)");
  require(c.runtime.step_timeout_s >= 0, "runtime.step_timeout_s", "must be >= 0 (0 = no limit)");
  require(c.train.max_consecutive_skips >= 1, "train.max_consecutive_skips",
          "must be >= 1 (the non-finite steps in a row train.on_nonfinite=skip tolerates before the run stops)");
  require(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at pre-emption)");
  require(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1");
  require(!c.run.dir.empty(), "run.dir", "must name a directory");
  return c;
}

// JSON allows an object to repeat a key, and nlohmann keeps the last one: in a configuration
// that silently drops a setting (or, for a repeated section, resets the first one's keys to their
// defaults). This walks the text the parser has already accepted (so it is well-formed, with
// comments allowed) and reports the first key seen twice in one object, with both positions.
static void check_duplicate_keys(const std::string& text, const std::string& source) {
  struct Frame {
    bool object;
    std::string path;  // "train" for the keys of the train section; "" at the top level
    std::vector<std::pair<std::string, std::pair<int, int>>> keys;  // key and its line:col
    bool expect_key = false;
    std::string last_key;
  };
  std::vector<Frame> stack;
  int line = 1, col = 1;
  auto where = [](std::pair<int, int> p) {
    return "line " + std::to_string(p.first) + ", column " + std::to_string(p.second);
  };
  size_t i = 0;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && i < text.size(); k++, i++) {
      if (text[i] == '\n') line++, col = 1;
      else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) col++;  // count characters, not bytes
    }
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') advance(1);
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      advance(2);
      while (i < text.size() && !(text[i] == '*' && i + 1 < text.size() && text[i + 1] == '/')) advance(1);
      advance(2);
    } else if (c == '"') {
      const std::pair<int, int> at{line, col};
      size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      const std::string token = text.substr(i, j + 1 - i);
      advance(j + 1 - i);
      if (stack.empty() || !stack.back().object || !stack.back().expect_key) continue;
      Frame& f = stack.back();
      f.expect_key = false;
      const std::string key = json::parse(token).get<std::string>();  // unescaped: "\u0061" is "a"
      f.last_key = key;
      for (auto& [k, first] : f.keys) {
        if (k != key) continue;
        if (f.path.empty() && stack.size() == 1)
          fail(source, ": section '", key, "' appears twice (", where(first), " and ", where(at),
               "); JSON keeps only the last one: merge them into one '", key, "' section");
        fail(source, ": duplicate key '", f.path.empty() ? key : f.path + "." + key, "' at ", where(first), " and ",
             where(at), "; JSON keeps only the last one: remove one of them");
      }
      f.keys.push_back({key, at});
    } else {
      if (c == '{' || c == '[') {
        std::string path;
        if (!stack.empty() && stack.back().object)
          path = stack.back().path.empty() ? stack.back().last_key : stack.back().path + "." + stack.back().last_key;
        else if (!stack.empty())
          path = stack.back().path;
        stack.push_back({c == '{', path, {}, c == '{', ""});
      } else if (c == '}' || c == ']') {
        if (!stack.empty()) stack.pop_back();
      } else if (c == ',') {
        if (!stack.empty() && stack.back().object) stack.back().expect_key = true;
      }
      advance(1);
    }
  }
}

// Model values from another source (llmpi-train --init-from): its fixed values must agree with
// what the user set; its defaults apply where the user set nothing.
static void apply_model_source(json& resolved, std::vector<std::string>& given, const ModelSource& src) {
  for (auto& [k, v] : src.fixed.items()) {
    const std::string path = "model." + k;
    // 0 where 0 means "automatic" (vocab_size, ffn_dim, max_seq_len, n_kv_head) is no conflict.
    const bool automatic = resolved["model"][k] == 0 && config_defaults()["model"].value(k, json()) == 0;
    if (std::find(given.begin(), given.end(), path) != given.end() && resolved["model"][k] != v && !automatic)
      fail("config: '", path, "' is set to ", resolved["model"][k].dump(), " but ", src.name, " has ", v.dump(),
           ": remove '", path, "' from the configuration (the weights decide it)");
    resolved["model"][k] = v;
    given.push_back(path);
  }
  for (auto& [k, v] : src.defaults.items()) {
    const std::string path = "model." + k;
    if (std::find(given.begin(), given.end(), path) != given.end()) continue;
    resolved["model"][k] = v;
    given.push_back(path);
  }
}

// train.global_batch and train.batch_per_rank both give a step's batch: one given by --set replaces
// the other given in the file (the file's is dropped: global_batch to its default, batch_per_rank
// to 0). Two given at the same level are left to resolve_batch, which refuses them unless they agree.
static void prefer_the_batch_set_last(json& resolved, std::vector<std::string>& given, size_t from_file) {
  auto at = [&](const char* key, size_t begin, size_t end) {
    return std::find(given.begin() + begin, given.begin() + end, key) != given.begin() + end;
  };
  auto drop = [&](const std::string& path) {  // "train.global_batch"
    given.erase(std::remove(given.begin(), given.end(), path), given.end());
    const std::string key = path.substr(path.find('.') + 1);
    resolved["train"][key] = config_defaults()["train"][key];
  };
  const size_t n = given.size();
  const bool per_rank_set = at("train.batch_per_rank", from_file, n), global_set = at("train.global_batch", from_file, n);
  if (per_rank_set && !global_set && resolved["train"]["batch_per_rank"] != 0 && at("train.global_batch", 0, from_file))
    drop("train.global_batch");
  else if (global_set && !per_rank_set && at("train.batch_per_rank", 0, from_file))
    drop("train.batch_per_rank");
}

Config parse_config(const std::string& text, const std::string& source,
                    const std::vector<std::string>& overrides, const ModelSource* model_source) {
  json user;
  try {
    user = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    std::string what = e.what();
    auto p = what.find("] ");
    fail(source, ": malformed JSON: ", p == std::string::npos ? what : what.substr(p + 2));
  }
  check_duplicate_keys(text, source);
  json resolved = config_defaults();
  std::vector<std::string> given;  // keys the user set
  merge_user(resolved, user, source, given);
  const size_t from_file = given.size();  // given[0, from_file) come from the file, the rest from --set
  for (auto& o : overrides) apply_override(resolved, o, given);
  prefer_the_batch_set_last(resolved, given, from_file);
  if (model_source) apply_model_source(resolved, given, *model_source);
  // The model section holds the chosen family's keys only, with that family's defaults for
  // those the user did not set; a key of another family is an error.
  const std::string family = resolved["model"]["family"];
  json fam = family_model_defaults(family);
  for (auto& path : given) {
    if (path.rfind("model.", 0) != 0) continue;
    const std::string k = path.substr(6);
    if (!fam.contains(k)) {
      std::string valid;
      for (auto& [name, v] : fam.items()) valid += (valid.empty() ? "" : ", ") + name;
      fail(source, ": 'model.", k, "' does not apply to model.family \"", family, "\" (its keys: ", valid,
           "; see `llmpi-train --help`)");
    }
    fam[k] = resolved["model"][k];
  }
  resolved["model"] = fam;
  const bool steps_given = std::find(given.begin(), given.end(), "train.steps") != given.end();
  const bool epochs_given = std::find(given.begin(), given.end(), "train.epochs") != given.end();
  if (steps_given && epochs_given && resolved["train"]["epochs"] != 0 && resolved["train"]["steps"] != 0)
    fail(source, ": both 'train.steps' (", resolved["train"]["steps"].dump(), ") and 'train.epochs' (",
         resolved["train"]["epochs"].dump(), ") are set; a run is measured in one of them: remove one or set it to 0 "
         "(e.g. --set train.epochs=0 --set train.steps=N)");
  Config c = extract(resolved);
  c.given = given;
  return c;
}

void resolve_batch(Config& c, int replicas) {
  if (replicas < 1) fail("resolve_batch: ", replicas, " data-parallel replicas");
  TrainConfig& t = c.train;
  json& r = c.resolved["train"];
  auto given = [&](const char* key) { return std::find(c.given.begin(), c.given.end(), key) != c.given.end(); };
  if (t.batch_per_rank > 0) {
    const int64_t g = (int64_t)t.batch_per_rank * replicas;
    if (g > std::numeric_limits<int>::max())
      fail("config: 'train.batch_per_rank' ", t.batch_per_rank, " × ", replicas, " data-parallel replicas is a global "
           "batch of ", g, ", more than this program counts: use a smaller train.batch_per_rank");
    const int64_t configured = r["global_batch"].get<int64_t>();
    if (given("train.global_batch") && configured != g)
      fail("config: 'train.global_batch' (", configured, ") and 'train.batch_per_rank' (", t.batch_per_rank,
           ") are both set, but ", t.batch_per_rank, " per replica × ", replicas, " data-parallel replica",
           replicas > 1 ? "s" : "", " is a global batch of ", g, ": give a step's batch by one of them (remove the "
           "other, or override one with --set train.global_batch=N for a fixed global batch or --set "
           "train.batch_per_rank=N for a batch per replica)");
    t.global_batch = (int)g;
    r["global_batch"] = g;
  }
  const double configured_lr = r["lr"].get<double>();
  const int reference = t.lr_reference_batch > 0 ? t.lr_reference_batch : t.batch_per_rank;
  const double ratio = reference > 0 ? (double)t.global_batch / reference : 1.0;
  t.lr_factor = t.lr_scaling == LrScaling::linear ? ratio : t.lr_scaling == LrScaling::sqrt ? std::sqrt(ratio) : 1.0;
  t.lr = configured_lr * t.lr_factor;
}

std::vector<std::string> keys_without_effect(const Config& c) {
  std::vector<std::string> notes;
  auto given = [&](const char* key) { return std::find(c.given.begin(), c.given.end(), key) != c.given.end(); };
  auto note = [&](const char* key, const std::string& why) {
    if (given(key)) notes.push_back(std::string("'") + key + "' has no effect " + why);
  };
  if (c.parallel.pp_stages == 1)
    for (const char* key : {"parallel.schedule", "parallel.virtual_stages", "parallel.stage_layers"})
      note(key, "with parallel.pp_stages 1: it shapes pipeline stages (set parallel.pp_stages > 1 to use one)");
  if (c.parallel.sync != SyncMethod::weights)
    note("parallel.average_every", std::string("with parallel.sync \"") + option_name(c.parallel.sync) +
                                       "\": only \"weights\" averages parameters");
  if (!c.parallel.overlap) {
    note("parallel.first_bucket_mb", "without parallel.overlap=true: the small first bucket only helps when buckets "
                                     "are reduced during backward");
    note("parallel.poll_us", "without parallel.overlap=true: it paces the communication thread");
  }
  if (c.parallel.tp == 1)
    note("parallel.sequence_parallel", "with parallel.tp 1: it splits the rows of a tensor-parallel group (set "
                                       "parallel.tp > 1)");
  if (c.data.val.empty())
    for (const char* key : {"train.eval_every", "train.eval_batches"})
      note(key, "without data.val: there is no validation split to evaluate");
  if (c.train.lr_schedule == LrSchedule::constant) note("train.min_lr_ratio", "with train.lr_schedule \"constant\"");
  if (c.train.lr_scaling == LrScaling::none)
    note("train.lr_reference_batch", "with train.lr_scaling \"none\": it is the batch a scaled rate is scaled from "
                                     "(set train.lr_scaling to \"linear\" or \"sqrt\" to use it)");
  if (c.train.optimizer == OptimizerKind::sgd)
    for (const char* key : {"train.beta1", "train.beta2", "train.eps"}) note(key, "with train.optimizer \"sgd\"");
  if (c.train.on_nonfinite == OnNonfinite::abort)
    note("train.max_consecutive_skips", "with train.on_nonfinite \"abort\": the first non-finite step stops the run");
  if (c.runtime.precision != GemmPrecision::bf16)
    note("runtime.cpu_bf16_gemm", std::string("with runtime.precision \"") + option_name(c.runtime.precision) +
                                      "\": it picks the CPU's bf16 GEMM engine");
  else if (c.runtime.device == DeviceChoice::cuda)
    note("runtime.cpu_bf16_gemm", "with runtime.device \"cuda\": it picks the CPU's bf16 GEMM engine");
  if (c.runtime.device == DeviceChoice::cuda)
    note("runtime.cpu_fp32_gemm", "with runtime.device \"cuda\": it picks the CPU's fp32 GEMM engine");
  if (c.model.family == Family::bert)
    note("runtime.lm_head_chunk_rows", "with model.family \"bert\": a classifier has no language-model head");
  return notes;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const ModelSource* model_source) {
  std::ifstream in(path);
  if (!in) fail("cannot read config file '", path, "': check the path given to --config");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides, model_source);
}

}  // namespace llmpi
