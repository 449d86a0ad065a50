// llmpi-sample: generate text with a gpt2 or llama model, from an llmpi checkpoint or a Hugging
// Face model directory. One process on the CPU (no mpiexec; the KV-cache forward is
// model/generate.h):
//
//   llmpi-sample --init-from runs/x/checkpoints/latest --prompt "Once upon a time" --max-new-tokens 100
//   llmpi-sample --init-from hf-model-dir --prompt-ids 1,2,3 --greedy --ids
//
// The model: a checkpoint file; a checkpoints directory, a run directory (its checkpoints/) or
// DIR/latest: the newest step-*.h5 there; or a directory with config.json + model.safetensors.
// The tokenizer: --tokenizer if given, else the one the run's training file names (byte; gpt2
// needs --gpt2-encoder/--gpt2-merges; hf needs --tokenizer hf:PATH), else DIR/tokenizer.json of a
// Hugging Face directory. Text streams to stdout token by token; notes go to stderr.
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/arg_checks.h"
#include "backend/ops.h"
#include "checkpoint/checkpoint.h"
#include "data/token_file.h"
#include "hf/hf_import.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "runtime/error.h"
#include "runtime/rng.h"
#include "tokenizer/tokenizer.h"

extern "C" void openblas_set_num_threads(int num_threads);

using namespace llmpi;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string init_from, prompt, prompt_ids, tokenizer, gpt2_encoder, gpt2_merges;
  bool have_prompt = false;
  int max_new_tokens = 100;
  float temperature = 1.0f, top_p = 1.0f;
  int top_k = 0;
  bool greedy = false, ids = false, no_kv_cache = false, allow_special = false, stats = false;
  std::string seed = "1337";  // read by parse_u64 (apps/arg_checks.h)
  int64_t eot_id = -2;  // -2: from the tokenizer / data / config; -1: never stop
  bool eot_given = false;
  int threads = 0;
};

// What the model source says about the tokenizer and the end-of-text id.
struct Source {
  std::string what;          // "checkpoint PATH (step N)" | "Hugging Face model DIR"
  std::string run_tokenizer; // the description of the tokenizer the run's data used ("" unknown)
  std::string data_note;     // why run_tokenizer is unknown
  std::string hf_tokenizer_json;  // DIR/tokenizer.json of a Hugging Face directory, if present
  int64_t eot_id = -1;       // from the run's data or config.json; -1 unknown
};

// The checkpoint or Hugging Face directory that `path` names (see the header comment).
std::string resolve_model_path(const std::string& path, bool* is_hf) {
  std::error_code ec;
  *is_hf = false;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "config.json", ec) &&
        (fs::exists(fs::path(path) / "model.safetensors", ec) ||
         fs::exists(fs::path(path) / "model.safetensors.index.json", ec))) {
      *is_hf = true;
      return path;
    }
    for (const fs::path& dir : {fs::path(path), fs::path(path) / "checkpoints"}) {
      const std::string latest = latest_checkpoint(dir.string());
      if (!latest.empty()) return latest;
    }
    fail("'", path, "' holds neither step-*.h5 checkpoints (itself or in checkpoints/) nor a Hugging Face model "
         "(config.json + model.safetensors); give a checkpoint file, a checkpoints directory, a run directory "
         "or a Hugging Face model directory");
  }
  if (fs::exists(path, ec)) return path;
  if (fs::path(path).filename() == "latest") {
    const std::string dir = fs::path(path).parent_path().string();
    const std::string latest = latest_checkpoint(dir.empty() ? "." : dir);
    if (latest.empty()) fail("'", path, "': there is no step-*.h5 checkpoint in '", dir, "'");
    return latest;
  }
  fail("'", path, "' does not exist; give a checkpoint file, a checkpoints directory (or DIR/latest), a run "
       "directory or a Hugging Face model directory");
}

// An llmpi checkpoint: the model (parameters of row 0) and what its run's data says.
std::unique_ptr<Model> load_checkpoint_model(const std::string& path, Source* src) {
  const CheckpointInfo info = read_checkpoint_info(path);
  src->what = "checkpoint " + path + " (step " + std::to_string(info.step) + ")";
  auto model = std::make_unique<Model>(info.desc, cpu_ops());
  const std::string why = generation_unsupported_reason(*model);
  if (!why.empty()) fail(path, ": ", why);
  if (param_table_json(model->table) != info.param_table_json || info.n != model->table.numel)
    fail(path, ": its parameter table does not match the layout this build gives its model description; "
         "the file was written by an incompatible version of llmpi");
  read_checkpoint_row(info, 0, model->params, nullptr, nullptr);
  if (info.rows > 1)
    std::fprintf(stderr, "llmpi-sample: note: %s holds %lld rows of parameters (sync 'weights'); using rank 0's\n",
                 path.c_str(), (long long)info.rows);
  // The run's training file names the tokenizer and the end-of-text id.
  std::string train;
  try {
    const nlohmann::json cfg = nlohmann::json::parse(info.config_json);
    train = cfg.at("data").at("train").get<std::string>();
  } catch (const std::exception&) {
  }
  if (!train.empty()) {
    try {
      const TokenFileInfo t = open_token_file_info(train);
      src->run_tokenizer = t.tokenizer;
      src->eot_id = t.eot_id;
    } catch (const Error& e) {
      src->data_note = "the run's training file '" + train + "' cannot be read (" + one_line(e.what()) + ")";
    }
  } else {
    src->data_note = "the checkpoint's configuration names no training file";
  }
  if (src->run_tokenizer.empty() && !info.data_json.empty()) {  // recorded identity of the data
    try {
      const nlohmann::json d = nlohmann::json::parse(info.data_json);
      if (d.contains("train") && d["train"].contains("tokenizer"))
        src->run_tokenizer = d["train"]["tokenizer"].get<std::string>();
    } catch (const std::exception&) {
    }
  }
  return model;
}

// A Hugging Face model directory.
std::unique_ptr<Model> load_hf_dir_model(const std::string& dir, Source* src) {
  src->what = "Hugging Face model " + dir;
  const HfConfig c = read_hf_config(dir);
  if (c.family != Family::gpt2 && c.family != Family::llama)
    fail(dir, ": ", c.architecture, " is a ", family_name(c.family),
         " model (a bidirectional encoder, not a language model); llmpi-sample generates with gpt2 and llama "
         "models only");
  HfModel hf = load_hf_model(dir);
  for (const std::string& n : hf.notes) std::fprintf(stderr, "llmpi-sample: note: %s\n", n.c_str());
  auto model = std::make_unique<Model>(hf.desc, cpu_ops());
  const std::string why = generation_unsupported_reason(*model);
  if (!why.empty()) fail(dir, ": ", why);
  if (hf.params.size() != model->table.numel) fail("internal: the imported table does not match the model's");
  std::copy(hf.params.begin(), hf.params.end(), model->params);
  // End of text: generation_config.json's eos_token_id, else config.json's (the first when a list).
  for (const char* name : {"generation_config.json", "config.json"}) {
    std::ifstream in(fs::path(dir) / name);
    if (!in) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(in);
      const auto it = j.find("eos_token_id");
      if (it == j.end() || it->is_null()) continue;
      src->eot_id = it->is_array() ? (*it)[0].get<int64_t>() : it->get<int64_t>();
      break;
    } catch (const std::exception&) {
    }
  }
  const fs::path tj = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(tj, ec)) src->hf_tokenizer_json = tj.string();
  return model;
}

// The tokenizer to use, or none (kind empty) when only ids are asked for and none is known.
bool choose_tokenizer(const Options& o, const Source& src, bool need_text, Tokenizer* tok) {
  std::string kind = o.tokenizer;
  if (kind.empty()) {
    if (!src.hf_tokenizer_json.empty()) {
      kind = "hf:" + src.hf_tokenizer_json;
    } else if (!src.run_tokenizer.empty()) {
      const std::string run_kind = src.run_tokenizer.substr(0, src.run_tokenizer.find(':'));
      if (run_kind == "byte") {
        kind = "byte";
      } else if (run_kind == "gpt2" && !o.gpt2_encoder.empty()) {
        kind = "gpt2";
      } else if (need_text) {
        fail("the run's data was tokenized with '", src.run_tokenizer, "'; give its files: ",
             run_kind == "gpt2" ? "--gpt2-encoder encoder.json --gpt2-merges vocab.bpe"
                                : "--tokenizer " + run_kind + ":PATH");
      }
    } else if (need_text) {
      fail("no tokenizer is known for ", src.what, src.data_note.empty() ? "" : ": " + src.data_note,
           "; give --tokenizer byte|gpt2|hf:PATH (or use --prompt-ids and --ids)");
    }
  }
  if (kind.empty()) return false;
  if (kind != "gpt2" && (!o.gpt2_encoder.empty() || !o.gpt2_merges.empty()))
    fail("--gpt2-encoder and --gpt2-merges go with the gpt2 tokenizer, not '", kind, "'");
  *tok = load_tokenizer(kind, o.gpt2_encoder, o.gpt2_merges);
  if (!src.run_tokenizer.empty() && tok->description != src.run_tokenizer)
    fail("the tokenizer given (", tok->description, ") is not the one the run's data was made with (",
         src.run_tokenizer, "); give the run's tokenizer files");
  return true;
}

// "1,2,3" or "1 2 3"
std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string t = s;
  std::replace(t.begin(), t.end(), ',', ' ');
  std::istringstream in(t);
  std::string w;
  while (in >> w) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != w.size() || v < 0 || v > INT32_MAX)
      fail("--prompt-ids: '", w, "' is not a token id (give non-negative integers separated by commas or spaces)");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// Writes text as it becomes final: the decoding of the shown prompt + new tokens beyond what was printed,
// held back while it ends in an incomplete character (U+FFFD from a partial UTF-8 sequence or
// byte-fallback pieces still to come).
struct TextStream {
  const Tokenizer& tok;
  std::vector<int32_t> ids;
  std::string printed;
  void emit(bool final) {
    const std::string text = decode(tok, ids);
    const bool pending = text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
    if ((pending && !final) || text.size() <= printed.size() || text.compare(0, printed.size(), printed) != 0) {
      if (final && text.compare(0, printed.size(), printed) != 0) {  // the decoding of earlier text changed
        std::fputs("\n", stdout);
        std::fputs(text.c_str(), stdout);
        printed = text;
      }
      std::fflush(stdout);
      return;
    }
    std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
    std::fflush(stdout);
    printed = text;
  }
};

int run(const Options& o) {
  require_at_least("--threads", o.threads, 0, "CPU threads, 0 = OMP_NUM_THREADS or every core");
  if (o.threads > 0) {
    omp_set_num_threads(o.threads);
    openblas_set_num_threads(o.threads);
  }
  SamplingParams s;
  s.greedy = o.greedy;
  s.temperature = o.temperature;
  s.top_k = o.top_k;
  s.top_p = o.top_p;
  check_sampling_params(s);
  require_at_least("--max-new-tokens", o.max_new_tokens, 0, "most tokens to generate");
  const uint64_t seed = parse_u64("--seed", o.seed, "the seed of the draws");
  if (o.eot_given)
    require_at_least<int64_t>("--eot-id", o.eot_id, -1, "the token id that stops generation, -1 = never stop");
  if (o.have_prompt && !o.prompt_ids.empty()) fail("give --prompt or --prompt-ids, not both");

  bool is_hf = false;
  const std::string path = resolve_model_path(o.init_from, &is_hf);
  Source src;
  std::unique_ptr<Model> model = is_hf ? load_hf_dir_model(path, &src) : load_checkpoint_model(path, &src);
  const ModelDesc& d = model->desc;
  // The generator refuses weights that are not finite, naming the tensor (model/generate.h).
  std::unique_ptr<Generator> gen;
  try {
    gen = std::make_unique<Generator>(*model, 0, !o.no_kv_cache);
  } catch (const Error& e) {
    fail(src.what, ": ", e.what());
  }

  const bool need_text = o.prompt_ids.empty() || !o.ids;
  Tokenizer tok;
  const bool have_tok = choose_tokenizer(o, src, need_text, &tok);
  if (have_tok && tok.vocab_size > d.vocab_size)
    fail("the tokenizer has ", tok.vocab_size, " ids but the model's vocabulary is ", d.vocab_size,
         "; give the tokenizer the model was trained with");

  // prompt: what the model is fed; shown: the ids whose text starts the output.
  std::vector<int32_t> prompt, shown;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
    if (prompt.empty()) fail("--prompt-ids: no ids given");
    shown = prompt;
  } else {
    for (uint32_t id : encode(tok, o.prompt, o.allow_special)) shown.push_back(static_cast<int32_t>(id));
    prompt = shown;
    // A Hugging Face model gets the text wrapped as its tokenizer's post-processor says (LLaMA's:
    // <s> first), as transformers' tokenizer(prompt) does before generate(). (llmpi-prep does
    // not wrap documents, so a model trained here gets the plain encoding.)
    if (is_hf && tok.kind == TokenizerKind::hf) {
      prompt.clear();
      for (uint32_t id : encode_with_template(tok, o.prompt, nullptr, o.allow_special).ids)
        prompt.push_back(static_cast<int32_t>(id));
    }
    if (prompt.empty()) {  // an empty prompt starts from end-of-text, as GPT-2's samples do
      if (!have_tok) fail("the prompt is empty; give --prompt or --prompt-ids");
      prompt.push_back(tok.eot_id);
    }
  }
  for (int32_t id : prompt)
    if (id >= d.vocab_size)
      fail("prompt id ", id, " is outside the model's vocabulary [0, ", d.vocab_size, ")");
  if (static_cast<int>(prompt.size()) >= d.max_seq_len)
    fail("the prompt has ", prompt.size(), " tokens but the model's context is ", d.max_seq_len,
         " positions, which leaves no room for a new token; shorten the prompt");

  if (o.eot_id >= d.vocab_size)
    fail("--eot-id ", o.eot_id, " is outside the model's vocabulary: give an id in [0, ", d.vocab_size,
         "), or -1 to never stop");
  int64_t stop = o.eot_id;
  if (stop == -2) stop = have_tok ? tok.eot_id : src.eot_id;
  const int choose_vocab = have_tok ? tok.vocab_size : d.vocab_size;

  std::fprintf(stderr, "llmpi-sample: %s: %s, %d layers, d_model %d, %d heads (%d kv), vocab %d, context %d; "
               "prompt %zu tokens; %s; %s\n",
               src.what.c_str(), family_name(d.family), d.n_layer, d.d_model, d.n_head, d.n_kv_head, d.vocab_size,
               d.max_seq_len, prompt.size(),
               s.greedy || s.temperature == 0 ? "greedy" : "sampling", o.no_kv_cache ? "no KV cache" : "KV cache");

  Rng rng(seed);
  TextStream text{tok, shown, ""};
  bool first = true;
  if (!o.ids) text.emit(false);
  const auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  const std::vector<int32_t> out = generate(
      *gen, prompt, o.max_new_tokens, s, rng, choose_vocab, static_cast<int32_t>(stop), [&](int32_t id) {
        if (first) t_first = std::chrono::steady_clock::now();
        if (o.ids) {
          std::printf(first ? "%d" : " %d", id);
          std::fflush(stdout);
        } else if (id != stop) {  // the text leaves the end-of-text token out
          text.ids.push_back(id);
          text.emit(false);
        }
        first = false;
      });
  if (o.ids) {
    std::printf("\n");
  } else {
    text.emit(true);
    std::printf("\n");
  }
  std::fflush(stdout);
  const auto t1 = std::chrono::steady_clock::now();
  if (o.stats) {
    const double prefill = std::chrono::duration<double>(t_first - t0).count();
    const double rest = std::chrono::duration<double>(t1 - t_first).count();
    std::fprintf(stderr, "llmpi-sample: %zu new tokens; prompt + first token %.3f s; %.2f tokens/s after it\n",
                 out.size(), prefill, out.size() > 1 ? (out.size() - 1) / rest : 0.0);
  }
  if (static_cast<int>(out.size()) < o.max_new_tokens && (out.empty() || out.back() != stop))
    std::fprintf(stderr, "llmpi-sample: note: stopped at the model's context of %d positions\n", d.max_seq_len);
  return 0;
}

const char* kFooter = R"(
The model (--init-from):
  a checkpoint file (runs/x/checkpoints/step-00001000.h5); a checkpoints directory or DIR/latest
  (the newest step-*.h5 in it); a run directory (its checkpoints/); or a Hugging Face model
  directory (config.json + model.safetensors or model.safetensors.index.json: GPT2LMHeadModel,
  LlamaForCausalLM). Only the gpt2 and llama families generate; a bert model is refused.

The tokenizer: --tokenizer when given; else, for a checkpoint, the one its run's training file
names (byte needs nothing; gpt2 needs --gpt2-encoder/--gpt2-merges; hf needs --tokenizer hf:PATH,
checked against the run's); else DIR/tokenizer.json of a Hugging Face directory. With
--prompt-ids and --ids no tokenizer is needed.

Decoding: greedy (--greedy or --temperature 0) takes the most likely token; otherwise tokens are
drawn from softmax(logits / temperature), restricted to the --top-k most likely (0 = all) and then
to the smallest set whose probability reaches --top-p (1 = all), with the project's PRNG seeded
by --seed (the same seed, model and options give the same tokens). Generation stops after
--max-new-tokens, after the end-of-text token (the tokenizer's, else the data's or config.json's
eos_token_id; --eot-id overrides, -1 = never stop; --ids lists the stop token, the text leaves it
out), or when the
prompt and the new tokens fill the model's context. A prompt must leave room for one new token.

Output: the prompt's text, then each new token's text as soon as it is chosen (stdout, flushed);
with --ids only the new token ids, space-separated, on one line. Notes go to stderr.

Runs on the CPU in one process (no mpiexec): each new token costs one position of work thanks to a
key/value cache (--no-kv-cache recomputes the whole sequence per token, for comparison). The CUDA
backend is not used for sampling. Threads: --threads, else OMP_NUM_THREADS, else every core.

Examples:
  llmpi-sample --init-from runs/x/checkpoints/latest --prompt "Once upon a time" --max-new-tokens 100
  llmpi-sample --init-from runs/x --prompt "The" --temperature 0.8 --top-k 40 --seed 7
  llmpi-sample --init-from hf/gpt2 --prompt-ids 464,2068 --greedy --ids --max-new-tokens 20
)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llmpi-sample: generate text with a gpt2 or llama model (an llmpi checkpoint or a Hugging Face "
               "model directory), on the CPU.",
               "llmpi-sample"};
  app.footer(kFooter);
  Options o;
  app.add_option("--init-from", o.init_from, "checkpoint file, checkpoints dir (or DIR/latest), run dir, or Hugging Face model dir")
      ->type_name("PATH")
      ->required();
  auto* prompt = app.add_option("--prompt", o.prompt, "the text to continue (empty: start from end-of-text)")->type_name("TEXT");
  app.add_option("--prompt-ids", o.prompt_ids, "the prompt as token ids, e.g. 1,2,3")->type_name("IDS");
  app.add_option("--max-new-tokens", o.max_new_tokens, "most tokens to generate")->capture_default_str();
  app.add_flag("--greedy", o.greedy, "always take the most likely token");
  app.add_option("--temperature", o.temperature, "divide the logits by this (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", o.top_k, "draw among the k most likely tokens (0 = all)")->capture_default_str();
  app.add_option("--top-p", o.top_p, "draw among the most likely tokens whose probability reaches p (1 = all)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the draws")->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer, "byte | gpt2 | hf:PATH/tokenizer.json (default: the run's)")->type_name("KIND");
  app.add_option("--gpt2-encoder", o.gpt2_encoder, "GPT-2 encoder.json (gpt2 tokenizer)")->type_name("PATH");
  app.add_option("--gpt2-merges", o.gpt2_merges, "GPT-2 vocab.bpe (gpt2 tokenizer)")->type_name("PATH");
  app.add_flag("--allow-special", o.allow_special, "encode special tokens written in the prompt (e.g. <|endoftext|>) as such");
  app.add_flag("--ids", o.ids, "print the new token ids instead of text");
  auto* eot = app.add_option("--eot-id", o.eot_id, "stop after this token id (-1 = never stop; default: the tokenizer's end-of-text)");
  app.add_flag("--no-kv-cache", o.no_kv_cache, "recompute the whole sequence for every token (slow; for comparison)");
  app.add_option("--threads", o.threads, "CPU threads (0 = OMP_NUM_THREADS or every core)")->capture_default_str();
  app.add_flag("--stats", o.stats, "print the time to the first token and the tokens per second (stderr)");
  if (const int status = parse_command_line(app, argc, argv, "llmpi-sample", 1); status >= 0) return status;
  o.have_prompt = prompt->count() > 0;
  o.eot_given = eot->count() > 0;
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "llmpi-sample: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
