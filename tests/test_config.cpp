// Config parsing and validation: every error names the key and says what to do.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "runtime/config.h"
#include "runtime/config_keys.h"
#include "runtime/error.h"

using namespace llmpi;

static const char* kMinimal = R"({"data": {"train": "t.h5"}})";

static std::string error_of(const std::string& text, std::vector<std::string> sets = {}) {
  try {
    parse_config(text, "run.json", sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsFillMissingKeys) {
  Config c = parse_config(kMinimal, "run.json");
  EXPECT_EQ(c.data.train, "t.h5");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.parallel.sync, SyncMethod::allreduce);
  EXPECT_EQ(c.resolved["train"]["lr"].get<double>(), 3e-4);  // Exact: the default is that literal
}

TEST(Config, OverridesApplyWithTypes) {
  Config c = parse_config(kMinimal, "run.json", {"train.lr=1e-3", "model.n_layer=2", "run.dir=out/x"});
  EXPECT_EQ(c.train.lr, 1e-3);  // Exact: "1e-3" parses to the double nearest it, as the literal
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.run.dir, "out/x");
  EXPECT_EQ(c.resolved["run"]["dir"], "out/x");
}

TEST(Config, UnknownKeySuggestsNearest) {
  std::string e = error_of(R"({"data": {"train": "t.h5"}, "train": {"learning_rate": 1}})");
  EXPECT_NE(e.find("unknown key 'train.learning_rate'"), std::string::npos) << e;
  e = error_of(R"({"data": {"train": "t.h5"}, "train": {"stpes": 10}})");
  EXPECT_NE(e.find("did you mean 'train.steps'"), std::string::npos) << e;
  e = error_of(R"({"data": {"train": "t.h5"}, "modle": {}})");
  EXPECT_NE(e.find("unknown section 'modle'"), std::string::npos) << e;
  EXPECT_NE(e.find("'model"), std::string::npos) << e;
  e = error_of(kMinimal, {"train.setps=3"});
  EXPECT_NE(e.find("did you mean 'train.steps'"), std::string::npos) << e;
}

TEST(Config, WrongTypeNamesKey) {
  std::string e = error_of(R"({"data": {"train": "t.h5"}, "model": {"n_layer": "four"}})");
  EXPECT_NE(e.find("'model.n_layer' must be an integer"), std::string::npos) << e;
  e = error_of(R"({"data": {"train": "t.h5"}, "model": {"n_layer": 2.5}})");
  EXPECT_NE(e.find("'model.n_layer' must be an integer"), std::string::npos) << e;
  e = error_of(R"({"data": {"train": 5}})");
  EXPECT_NE(e.find("'data.train' must be a string"), std::string::npos) << e;
  EXPECT_EQ(error_of(R"({"data": {"train": "t.h5"}, "train": {"lr": 1}})"), "");  // int for float: fine
}

TEST(Config, MalformedJsonSaysWhere) {
  std::string e = error_of("{\"data\": {\"train\": \"t.h5\",}}");
  EXPECT_NE(e.find("run.json: malformed JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
}

TEST(Config, SemanticChecks) {
  EXPECT_NE(error_of("{}").find("'data.train' is required"), std::string::npos);
  std::string e = error_of(R"({"data": {"train": "t.h5"}, "model": {"n_head": 3, "d_model": 8}})");
  EXPECT_NE(e.find("'model.d_model' must be a positive multiple of model.n_head (3)"), std::string::npos) << e;
  e = error_of(kMinimal, {"parallel.sync=ring"});
  EXPECT_NE(e.find("'parallel.sync'"), std::string::npos) << e;
  e = error_of(kMinimal, {"runtime.device=tpu"});
  EXPECT_NE(e.find("'runtime.device'"), std::string::npos) << e;
  e = error_of(kMinimal, {"train.global_batch=0"});
  EXPECT_NE(e.find("'train.global_batch' must be >= 1"), std::string::npos) << e;
}

TEST(Config, BadOverrideSyntax) {
  std::string e = error_of(kMinimal, {"lr"});
  EXPECT_NE(e.find("expected key.path=value"), std::string::npos) << e;
}

TEST(Config, MissingFileNamesPath) {
  try {
    load_config("/nonexistent/run.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/run.json"), std::string::npos);
  }
}

// Epoch-based runs: train.epochs or train.steps, not both; the schedule names are checked.
TEST(Config, EpochsAndScheduleKeys) {
  Config c = parse_config(kMinimal, "run.json", {"train.epochs=3", "train.drop_last=false", "train.lr_schedule=linear"});
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_FALSE(c.train.drop_last);
  EXPECT_EQ(c.train.lr_schedule, LrSchedule::linear);
  std::string e = error_of(kMinimal, {"train.epochs=3", "train.steps=100"});
  EXPECT_NE(e.find("both 'train.steps' (100) and 'train.epochs' (3) are set"), std::string::npos) << e;
  EXPECT_EQ(error_of(kMinimal, {"train.epochs=3", "train.steps=0"}), "");  // 0 steps: measured in epochs
  e = error_of(kMinimal, {"train.lr_schedule=step"});
  EXPECT_NE(e.find("'train.lr_schedule' must be \"cosine\", \"linear\" or \"constant\""), std::string::npos) << e;
  e = error_of(kMinimal, {"train.epochs=-1"});
  EXPECT_NE(e.find("'train.epochs' must be >= 0"), std::string::npos) << e;
  EXPECT_EQ(error_of(kMinimal, {"train.eval_batches=0"}), "");  // 0 = the whole validation file
}

// A key the user set that does nothing in the configuration it is in is named (the trainer warns at
// start-up); keys left at their defaults, and keys that act, are not.
TEST(Config, KeysWithoutEffectAreNamed) {
  auto notes = [](std::vector<std::string> sets) {
    sets.insert(sets.begin(), "data.train=t.h5");
    return keys_without_effect(parse_config("{}", "test", sets));
  };
  EXPECT_TRUE(notes({}).empty());
  EXPECT_TRUE(notes({"parallel.microbatches=4"}).empty()) << "gradient accumulation with pp_stages 1";
  EXPECT_TRUE(notes({"parallel.pp_stages=2", "parallel.schedule=gpipe"}).empty());
  std::vector<std::string> n = notes({"parallel.schedule=gpipe", "parallel.average_every=4", "train.eval_every=5"});
  ASSERT_EQ(n.size(), 3u);
  EXPECT_NE(n[0].find("'parallel.schedule' has no effect with parallel.pp_stages 1"), std::string::npos) << n[0];
  EXPECT_NE(n[1].find("'parallel.average_every' has no effect with parallel.sync \"allreduce\""), std::string::npos)
      << n[1];
  EXPECT_NE(n[2].find("'train.eval_every' has no effect without data.val"), std::string::npos) << n[2];
  EXPECT_EQ(notes({"parallel.sync=weights", "parallel.average_every=4"}).size(), 0u);
  EXPECT_EQ(notes({"train.max_consecutive_skips=3"}).size(), 1u) << "with on_nonfinite abort";
  EXPECT_EQ(notes({"train.on_nonfinite=skip", "train.max_consecutive_skips=3"}).size(), 0u);
  EXPECT_EQ(notes({"model.family=bert", "runtime.lm_head_chunk_rows=64"}).size(), 1u);
}

// The configuration reference (--help, docs/CONFIG.md) has one description per key of the defaults document.
TEST(ConfigKeyDocs, EveryKeyDescribedOnce) {
  const std::vector<std::string> problems = config_key_docs_missing();
  std::string all;
  for (const std::string& p : problems) all += p + "\n";
  EXPECT_TRUE(problems.empty()) << all;
  const std::string md = config_keys_markdown();
  EXPECT_NE(md.find("| `train.global_batch` | `16` |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `model.norm_eps` | `1e-05` (bert: `1e-12`) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `model.n_kv_head` | `0` | llama |"), std::string::npos) << md;
  EXPECT_EQ(md.find("no description"), std::string::npos) << md;
}

// Every key's range comes from its one entry in the table: a value just outside it is refused
// naming the key, the range and the value; the bound itself (when closed) is taken. A key of a
// family that does not take it is set with model.family at one that does.
TEST(ConfigKeys, EveryRangeIsEnforcedFromTheTable) {
  int checked = 0;
  for (const ConfigKey& k : config_keys()) {
    if (!k.range.any()) continue;
    std::vector<std::string> sets = {"data.train=t.h5"};
    if (k.families && !(k.families & 1u)) sets.push_back(k.families & 2u ? "model.family=llama" : "model.family=bert");
    const bool integer = k.def.is_number_integer();
    const bool has_lo = k.range.lo == k.range.lo;
    const double bound = has_lo ? k.range.lo : k.range.hi, step = integer ? 1.0 : 0.5;
    const bool open = has_lo ? k.range.lo_open : k.range.hi_open;
    // just outside: past the bound (or the bound itself when it is open)
    const double outside = open ? bound : has_lo ? bound - step : bound + step;
    char text[64];
    std::snprintf(text, sizeof text, integer ? "%.0f" : "%g", outside);
    std::vector<std::string> bad = sets;
    bad.push_back(std::string(k.key) + "=" + text);
    const std::string e = error_of("{}", bad);
    EXPECT_NE(e.find(std::string("'") + k.key + "' must be "), std::string::npos) << k.key << ": " << e;
    EXPECT_NE(e.find(std::string(", got ") + text), std::string::npos) << k.key << ": " << e;
    if (!open) {
      std::snprintf(text, sizeof text, integer ? "%.0f" : "%g", bound);
      std::vector<std::string> ok = sets;
      ok.push_back(std::string(k.key) + "=" + text);
      const std::string at_bound = error_of("{}", ok);
      EXPECT_EQ(at_bound.find(std::string("'") + k.key + "' must be "), std::string::npos) << k.key << ": " << at_bound;
    }
    checked++;
  }
  EXPECT_GE(checked, 40) << "keys with a range in the table";
}

// The defaults document, the families' keys and the reference are the table's: each key once,
// with its default, and a model key only in the families that take it.
TEST(ConfigKeys, TheDefaultsDocumentIsTheTable) {
  size_t n = 0;
  for (const auto& [sec, obj] : config_defaults().items()) n += obj.size();
  EXPECT_EQ(n, config_keys().size());
  for (const ConfigKey& k : config_keys()) {
    const std::string key = k.key, sec = k.section(), name = k.name();
    EXPECT_EQ(config_defaults()[sec][name], k.def) << key;
    if (sec != "model") continue;
    for (const char* fam : {"gpt2", "llama", "bert"}) {
      const nlohmann::json m = family_model_defaults(fam);
      Family f{};
      ASSERT_TRUE(parse_option(fam, &f));
      EXPECT_EQ(m.contains(name), (k.families >> static_cast<int>(f) & 1u) != 0) << key << " in " << fam;
    }
  }
  EXPECT_EQ(family_model_defaults("bert")["norm_eps"].get<double>(), 1e-12);  // Exact: the table's literal
  EXPECT_FALSE(family_model_defaults("llama")["tie_embeddings"].get<bool>());
}
