// Where a Hugging Face model directory may be written, and how one replaces another.
//
//   A run directory and a Hugging Face model directory both have a config.json, in different
//   languages: a run's is the resolved training configuration (llmpi-sample, --resume and
//   llmpi-export read it), a model's is transformers' (--init-from and transformers read it).
//   Neither kind is ever written into the other. describe_llmpi_run_dir and is_hf_export_dir tell
//   them apart (llmpi-export refuses --out that is a run; llmpi-train must refuse a run.dir that
//   is a model).
//
//   llmpi-export writes a new, empty or missing --out, or replaces its own earlier export (one
//   whose llmpi_export.json lists every file in it). Anything else non-empty is refused unless
//   told --overwrite, which moves what was there to a sibling OUT.previous-YYYYmmdd-HHMMSS/
//   (nothing is deleted). The export is written into a temporary directory beside --out and
//   swapped in whole (renameat2 RENAME_EXCHANGE, else two renames), so --out holds either the
//   complete old contents or the complete new ones, never a mixture (no old tokenizer beside
//   new weights) and never a partial export.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llmpi {

// The record llmpi-export leaves in its output directory: format "llmpi-export", the files it wrote.
extern const char* const kExportRecord;  // "llmpi_export.json"

// What `dir` holds of an llmpi run, e.g. "checkpoints/ (2 step-*.h5), metrics.jsonl, the run's
// config.json"; "" when it holds none (or does not exist). A checkpoints folder (step-*.h5 files)
// counts as part of a run.
std::string describe_llmpi_run_dir(const std::string& dir);

// Whether `dir` holds a Hugging Face model: a config.json naming "architectures" or "model_type",
// or model.safetensors / model.safetensors.index.json. *what (when given) gets a description,
// e.g. "a Hugging Face model (config.json of GPT2LMHeadModel, model.safetensors)".
bool is_hf_export_dir(const std::string& dir, std::string* what = nullptr);

// An export in the making: files go into `staging`; commit_export_dir puts them at `out`.
// Destroying an uncommitted one removes the staging directory.
struct ExportDir {
  std::string out;               // the destination, normalised (absolute, no trailing '/')
  std::string staging;           // a new directory beside out
  bool out_exists = false;       // out is there (empty, an earlier export, or --overwrite)
  bool keep_previous = false;    // out holds what llmpi-export did not write: move it aside
  bool committed = false;
  ExportDir() = default;
  ExportDir(const ExportDir&) = delete;
  ExportDir& operator=(const ExportDir&) = delete;
  ~ExportDir();
};

// Checks `out` (before anything is computed) and makes the staging directory. Throws Error when
// out is a file, an llmpi run directory (whatever overwrite says), the working directory or one
// above it, or a non-empty directory that is not an earlier llmpi export and overwrite is false.
void open_export_dir(ExportDir& e, const std::string& out, bool overwrite);

// Writes kExportRecord into the staging directory (`record` plus "format", "version" and "files":
// every file there) and swaps the staging directory in at `out`. Returns where out's earlier
// contents went when they were kept (--overwrite), "" otherwise (nothing there, or an earlier
// export, which is removed).
std::string commit_export_dir(ExportDir& e, nlohmann::json record);

}  // namespace llmpi
