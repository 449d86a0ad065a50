#include "runtime/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "runtime/config_keys.h"
#include "runtime/error.h"
#include "runtime/model_source.h"

namespace llmpi {

JsonDoc::JsonDoc() : j_(std::make_unique<nlohmann::json>(nlohmann::json::object())) {}
JsonDoc::JsonDoc(const nlohmann::json& j) : j_(std::make_unique<nlohmann::json>(j)) {}
JsonDoc::JsonDoc(const JsonDoc& o) : j_(std::make_unique<nlohmann::json>(*o.j_)) {}
JsonDoc& JsonDoc::operator=(const JsonDoc& o) {
  *j_ = *o.j_;
  return *this;
}
JsonDoc::~JsonDoc() = default;
nlohmann::json& JsonDoc::operator[](const char* key) { return (*j_)[key]; }
const nlohmann::json& JsonDoc::operator[](const char* key) const { return j_->at(key); }

using nlohmann::json;

const json& config_defaults() {
  static const json d = [] {
    json j = json::object();
    for (const ConfigKey& k : config_keys()) j[k.section()][k.name()] = k.def;
    return j;
  }();
  return d;
}

json family_model_defaults(const std::string& family) {
  Family f{};
  if (!parse_option(family, &f))
    fail("config: 'model.family' must be ", option_words<Family>(), ", got \"", family, "\"");
  json m = json::object();
  for (const ConfigKey& k : config_keys()) {
    if (!(k.families & (1u << static_cast<int>(f)))) continue;
    m[k.name()] = k.family_defaults.contains(family) ? k.family_defaults[family] : k.def;
  }
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

// Every key read as the table says (config_keys.h: its type and range), then the checks between
// keys and those a range does not say.
static Config extract(const json& r) {
  Config c;
  c.resolved = r;
  // Keys a family does not take read as the document's defaults (they are not used).
  json m = config_defaults()["model"];
  for (auto& [k, v] : r["model"].items()) m[k] = v;
  auto value = [&](const ConfigKey& k) -> const json& {
    return k.section() == "model" ? m[k.name()] : r[k.section()][k.name()];
  };
  // every value as its field's type first (a value its type cannot hold is named before any range)
  for (const ConfigKey& k : config_keys()) k.read(c, value(k));
  for (const ConfigKey& k : config_keys()) check_key_range(k, value(k));
  require(c.model.d_model >= 1 && c.model.d_model % c.model.n_head == 0, "model.d_model",
          "must be a positive multiple of model.n_head (" + std::to_string(c.model.n_head) + "), got " +
              std::to_string(c.model.d_model));
  if (c.model.family == Family::llama) {
    if (c.model.n_kv_head > 0 && c.model.n_head % c.model.n_kv_head != 0)
      fail("config: 'model.n_kv_head' (", c.model.n_kv_head, ") must divide 'model.n_head' (", c.model.n_head,
           "): every key/value head serves the same number of query heads");
    require((c.model.d_model / c.model.n_head) % 2 == 0, "model.d_model",
            "/ model.n_head must be even for rotary positions (llama), got " +
                std::to_string(c.model.d_model / c.model.n_head));
  }
  require(!c.data.train.empty(), "data.train",
          "is required: the path of a token file made by llmpi-prep (e.g. --set data.train=out/train.h5)");
  if (c.train.lr_scaling != LrScaling::none && c.train.lr_reference_batch == 0 && c.train.batch_per_rank == 0)
    fail("config: 'train.lr_scaling' \"", option_name(c.train.lr_scaling), "\" scales train.lr from the batch it is "
         "meant for, which nothing names: set train.lr_reference_batch to that global batch (or give the batch as "
         "train.batch_per_rank, which is then the reference)");
  if (c.parallel.sequence_parallel && c.parallel.tp > 1) {
    require(c.model.seq_len % c.parallel.tp == 0, "parallel.sequence_parallel",
            "splits each micro-batch's rows over the parallel.tp ranks: model.seq_len (" +
                std::to_string(c.model.seq_len) + ") must be a multiple of parallel.tp (" +
                std::to_string(c.parallel.tp) + ")");
    require(!(c.parallel.pp_stages > 1 && c.parallel.schedule == ScheduleKind::zb_h1), "parallel.sequence_parallel",
            "does not combine with parallel.schedule \"zb-h1\" (its deferred weight gradients would read branch "
            "inputs gathered again for every layer): use \"1f1b\" or \"interleaved\"");
  }
  const std::string sync_error = sync_choice_error(c.parallel.sync, c.parallel.zero > 0, c.parallel.grad_dtype,
                                                   c.parallel.overlap);
  if (!sync_error.empty()) fail(sync_error);
  const std::string recompute_error = recompute_schedule_error(c.runtime.recompute, c.parallel.schedule,
                                                               c.parallel.pp_stages);
  if (!recompute_error.empty()) fail(recompute_error);
  for (int n : c.parallel.stage_layers)
    require(n >= 0, "parallel.stage_layers", "must list layer counts >= 0, one per (virtual) stage");
  if (c.runtime.device == DeviceChoice::cpu) {  // explicit; an automatic choice is checked when resolved
    const std::string e = precision_device_error(c.runtime.precision, c.runtime.device, false);
    if (!e.empty()) fail(e);
  }
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

// In the order the keys were given, each once.
std::vector<std::string> keys_without_effect(const Config& c) {
  std::vector<std::string> notes, seen;
  for (const std::string& key : c.given) {
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    const ConfigKey* k = find_config_key(key);
    const std::string why = k ? k->no_effect(c) : std::string();
    if (!why.empty()) notes.push_back("'" + key + "' has no effect " + why);
  }
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
