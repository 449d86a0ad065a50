// llmpi-export: an llmpi checkpoint (any family) as a Hugging Face model directory that
// transformers loads without warnings:
//   llmpi-export --checkpoint runs/x/checkpoints/step-00001000.h5 --out exported/
//   llmpi-export --checkpoint runs/x --out exported/          (the run's newest checkpoint)
//   llmpi-export --hf-dir hf-model/ --out exported/           (import + export: a check, and a
//                                                              fixture tool; see tools/make_hf_fixtures.py)
// Writes config.json and model.safetensors (hf/hf_export.h). Tokenizer files are copied when the
// run knows them: a run started with --init-from DIR records DIR (run.dir/init_from.json) and the
// tokenizer files found there are copied; --tokenizer-files DIR copies them from DIR instead.
// The run's data file supplies the end-of-text id (gpt2, llama) or the label names and padding id
// (bert) for config.json when it is still where the run read it.
// --out is checked before anything is read (hf/export_dir.h): never a run directory; a new, empty
// or earlier-export directory, or anything else with --overwrite (its contents are moved aside).
// The files are written beside it and swapped in whole, with llmpi_export.json listing them.
// A tensor that is not finite is refused by name and nothing is written. Exit 2 on any error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/arg_checks.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/sharded.h"
#include "data/classification_file.h"
#include "data/token_file.h"
#include "hf/export_dir.h"
#include "hf/hf_export.h"
#include "hf/hf_import.h"
#include "model/transformer.h"
#include "runtime/error.h"

using namespace llmpi;
namespace fs = std::filesystem;

namespace {

// The tokenizer files a Hugging Face model directory may hold.
const char* const kTokenizerFiles[] = {"tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
                                       "vocab.txt",       "vocab.json",            "merges.txt",
                                       "tokenizer.model", "added_tokens.json"};

int copy_tokenizer_files(const std::string& from, const std::string& to) {
  int n = 0;
  for (const char* f : kTokenizerFiles) {
    const fs::path src = fs::path(from) / f;
    if (!fs::is_regular_file(src)) continue;
    std::error_code ec;
    fs::copy_file(src, fs::path(to) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("cannot copy '", src.string(), "' to '", to, "': ", ec.message());
    std::printf("llmpi-export: copied %s from %s\n", f, from.c_str());
    n++;
  }
  return n;
}

// A checkpoint file, or the newest checkpoint of a run directory or of its checkpoints/ folder.
std::string resolve_checkpoint(const std::string& p) {
  if (fs::is_regular_file(p)) return p;
  if (fs::is_directory(p)) {
    for (const std::string& d : {p + "/checkpoints", p}) {
      if (!fs::is_directory(d)) continue;
      const std::string latest = latest_checkpoint(d);
      if (!latest.empty()) return latest;
    }
    fail("'", p, "' holds no checkpoint (step-*.h5, or checkpoints/step-*.h5): give a checkpoint file or a run directory");
  }
  fail("'", p, "' does not exist: give a checkpoint file (run.dir/checkpoints/step-*.h5) or a run directory");
}

// What the run's data file says that config.json should carry; notes when it cannot be read.
void options_from_run(const CheckpointInfo& info, HfExportOptions& o) {
  nlohmann::json cfg = nlohmann::json::parse(info.config_json, nullptr, false);
  if (cfg.is_discarded() || !cfg.contains("data") || !cfg["data"].contains("train")) return;
  const std::string train = cfg["data"]["train"].get<std::string>();
  const std::string format = hdf5_format_of(train);
  try {
    if (format == kTokenFileFormat) {
      TokenReader r(train);
      o.eos_token_id = o.bos_token_id = static_cast<int>(r.info().eot_id);
    } else if (format == "llmpi-classification") {
      const ClassificationInfo ci = open_classification_file_info(train);
      o.label_names = ci.label_names;
      o.pad_token_id = static_cast<int>(ci.pad_id);
    } else {
      std::printf("llmpi-export: note: the run's data file '%s' is not readable here; config.json gets no "
                  "special-token ids%s\n", train.c_str(), info.desc.family == Family::bert ? " or label names" : "");
    }
  } catch (const Error& e) {
    std::printf("llmpi-export: note: %s (config.json gets no special-token ids)\n", e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llmpi-export: write an llmpi checkpoint (gpt2, llama or bert) as a Hugging Face model directory\n"
               "(config.json + model.safetensors, and the tokenizer files when known) that transformers loads."};
  std::string checkpoint, hf_dir, out, tokenizer_dir;
  int64_t row = 0;
  bool overwrite = false;
  auto* ck = app.add_option("--checkpoint", checkpoint,
                            "an llmpi checkpoint (run.dir/checkpoints/step-*.h5), or a run directory (its newest)");
  auto* hf = app.add_option("--hf-dir", hf_dir,
                            "instead of a checkpoint: a Hugging Face model directory, imported then exported again");
  ck->excludes(hf);
  app.add_option("--out", out,
                 "output directory: new, empty, or an earlier llmpi export (replaced whole); never a run directory")
      ->required();
  app.add_flag("--overwrite", overwrite,
               "write over a non-empty --out that is not an earlier llmpi export: its contents are moved to "
               "OUT.previous-<date>/ (nothing is deleted)");
  app.add_option("--tokenizer-files", tokenizer_dir,
                 "copy tokenizer.json, vocab.txt, ... from this directory (default: the run's --init-from directory)");
  auto* row_opt = app.add_option(
      "--row", row, "for a sync \"weights\" checkpoint, whose ranks differ: which rank's parameters (default 0)");
  if (const int status = parse_command_line(app, argc, argv, "llmpi-export", 2); status >= 0) return status;
  try {
    if (checkpoint.empty() && hf_dir.empty()) fail("give --checkpoint PATH (or --hf-dir DIR); see --help");
    if (row_opt->count() && !hf_dir.empty())
      fail("--row picks one rank's parameters of a --checkpoint; it does not apply to --hf-dir");
    require_at_least<int64_t>("--row", row, 0, "a rank of the checkpoint, 0 = the first");
    ExportDir dest;
    open_export_dir(dest, out, overwrite);  // before anything is read: a refused --out costs nothing
    nlohmann::json record;
    std::string tok_from = tokenizer_dir;
    if (!hf_dir.empty()) {
      const HfModel m = load_hf_model(hf_dir);
      for (const std::string& n : m.notes) std::printf("llmpi-export: note: %s\n", n.c_str());
      export_hf_model(dest.staging, m.desc, m.table, m.params.data());
      if (tok_from.empty()) tok_from = hf_dir;
      record["source"] = {{"hf_dir", hf_dir}};
    } else {
      const std::string path = resolve_checkpoint(checkpoint);
      const CheckpointInfo info = read_checkpoint_info(path);
      const ParamTable table = build_param_table(info.desc);
      if (info.n != table.numel)
        fail("'", path, "' holds ", info.n, " parameters but its ", family_name(info.desc.family), " description needs ",
             table.numel, ": the checkpoint is damaged or from an incompatible version");
      if (row >= info.rows)
        fail("--row ", row, " is not a row of '", path, "': it has ", info.rows, " (give --row in [0, ", info.rows,
             "))");
      HfExportOptions o;
      options_from_run(info, o);
      if (info.version >= kShardedVersion) {
        // Tensor by tensor from the file, after its parameters' checksums: one tensor in memory.
        const CheckpointReader reader(info);
        reader.verify_share(1, 0, 1);
        export_hf_model(dest.staging, info.desc, table, [&](const ParamSlice& s, float* out) {
          const ParamSlice* f = reader.whole.find(s.name);
          const size_t at = f ? (size_t)(f - reader.whole.slices.data()) : 0;
          if (!f || f->shape != s.shape)
            fail("'", path, "' has no tensor '", s.name, "' of the shape its model description gives: the "
                 "checkpoint is damaged or from an incompatible version");
          const auto [R, C] = rows_cols(s.shape);
          reader.read(0, at, row, TensorRect{0, R, 0, C}, out);
        }, o);
      } else {  // versions 1 and 2: one [rows, n] dataset, read whole
        std::vector<float> params(info.n);
        read_checkpoint_row(info, row, params.data(), nullptr, nullptr);
        export_hf_model(dest.staging, info.desc, table, params.data(), o);
      }
      std::printf("llmpi-export: %s (step %lld, %s, %zu parameters)\n", path.c_str(), (long long)info.step,
                  family_name(info.desc.family), info.n);
      record["source"] = {{"checkpoint", path}, {"step", info.step}, {"row", row}};
      // The run's --init-from directory: run.dir/init_from.json next to run.dir/checkpoints/.
      const fs::path rec = fs::path(path).parent_path().parent_path() / "init_from.json";
      if (tok_from.empty() && fs::is_regular_file(rec)) {
        std::ifstream in(rec);
        std::stringstream ss;
        ss << in.rdbuf();
        const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
        if (!j.is_discarded() && j.contains("dir") && j["dir"].is_string()) tok_from = j["dir"].get<std::string>();
      }
    }
    const int copied = tok_from.empty() ? 0 : copy_tokenizer_files(tok_from, dest.staging);
    if (!tokenizer_dir.empty() && copied == 0)
      fail("--tokenizer-files '", tokenizer_dir, "' holds none of tokenizer.json, vocab.txt, vocab.json, merges.txt, ...");
    if (copied) record["tokenizer_from"] = tok_from;
    const std::string previous = commit_export_dir(dest, record);
    if (!previous.empty())
      std::printf("llmpi-export: --overwrite: what %s held is now in %s\n", out.c_str(), previous.c_str());
    std::printf("llmpi-export: wrote %s/config.json and %s/model.safetensors%s\n", out.c_str(), out.c_str(),
                copied ? " and the tokenizer files" : " (no tokenizer files known: --tokenizer-files DIR adds them)");
  } catch (const Error& e) {
    std::fprintf(stderr, "llmpi-export: error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  return 0;
}
