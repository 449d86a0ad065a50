// Export destinations: see export_dir.h.
#include "hf/export_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "metrics/metrics.h"
#include "runtime/error.h"

namespace llmpi {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kExportRecord = "llmpi_export.json";

namespace {

// The JSON object in a file, or a discarded value when it is missing or not JSON.
json read_json_object(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return json(json::value_t::discarded);
  json j = json::parse(in, nullptr, false);
  return j.is_object() ? j : json(json::value_t::discarded);
}

int count_checkpoints(const fs::path& dir) {
  std::error_code ec;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && e.path().extension() == ".h5") n++;
  }
  return n;
}

// The entries of a directory (names, sorted).
std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  if (ec) fail("cannot list '", dir.string(), "': ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

std::string list_names(const std::vector<std::string>& names, size_t most = 5) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; i++) s += (i ? ", " : "") + names[i];
  if (names.size() > most) s += " and " + std::to_string(names.size() - most) + " more";
  return s;
}

// An unused name `base` + suffix ("", "-2", "-3", ...).
fs::path unused(const std::string& base) {
  std::error_code ec;
  fs::path p = base;
  for (int i = 2; fs::exists(p, ec) || fs::is_symlink(p, ec); i++) p = base + "-" + std::to_string(i);
  return p;
}

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// Atomically exchanges two paths (both must exist); false where the file system or kernel
// cannot (the caller falls back to two renames).
bool exchange(const fs::path& a, const fs::path& b) {
#ifdef RENAME_EXCHANGE
  if (renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    fail("cannot swap '", a.string(), "' into place at '", b.string(), "': ", std::strerror(errno));
#endif
  return false;
}

void rename_or_fail(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    fail("cannot rename '", from.string(), "' to '", to.string(), "': ", std::strerror(errno));
}

}  // namespace

std::string describe_llmpi_run_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  const fs::path d = dir;
  std::vector<std::string> parts;
  if (fs::is_directory(d / "checkpoints", ec))
    parts.push_back("checkpoints/ (" + std::to_string(count_checkpoints(d / "checkpoints")) + " step-*.h5)");
  if (const int n = count_checkpoints(d)) parts.push_back(std::to_string(n) + " checkpoint files (step-*.h5)");
  for (const char* f : {"metrics.jsonl", "eval.jsonl", "LOCK", "PREEMPTED", "init_from.json", "comm_plan.json",
                        "summary.json"})
    if (fs::exists(d / f, ec)) parts.push_back(f);
  // A run's resolved config.json has the training sections; transformers' has none of them.
  const json c = read_json_object(d / "config.json");
  if (!c.is_discarded() && c.contains("train") && c.contains("run") && c.contains("model"))
    parts.push_back("the run's config.json");
  return list_names(parts, parts.size());
}

bool is_hf_export_dir(const std::string& dir, std::string* what) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  const fs::path d = dir;
  std::vector<std::string> parts;
  const json c = read_json_object(d / "config.json");
  if (!c.is_discarded() && (c.contains("architectures") || c.contains("model_type"))) {
    std::string arch = "a model";
    if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty() &&
        c["architectures"][0].is_string())
      arch = c["architectures"][0].get<std::string>();
    else if (c.contains("model_type") && c["model_type"].is_string())
      arch = "model_type " + c["model_type"].get<std::string>();
    parts.push_back("config.json of " + arch);
  }
  for (const char* f : {"model.safetensors", "model.safetensors.index.json"})
    if (fs::exists(d / f, ec)) parts.push_back(f);
  if (parts.empty()) return false;
  if (what) *what = "a Hugging Face model (" + list_names(parts, parts.size()) + ")";
  return true;
}

ExportDir::~ExportDir() {
  if (committed || staging.empty()) return;
  std::error_code ec;
  fs::remove_all(staging, ec);
}

void open_export_dir(ExportDir& e, const std::string& out, bool overwrite) {
  if (out.empty()) fail("--out is empty: give the directory to write the model into");
  std::error_code ec;
  fs::path p = fs::absolute(out, ec).lexically_normal();
  if (p.has_parent_path() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  e.out = p.string();
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    fail("--out '", out, "' exists and is not a directory; give a directory (it is created when missing)");
  if (fs::is_directory(p, ec)) {
    const std::string run = describe_llmpi_run_dir(e.out);
    if (!run.empty())
      fail("--out '", out, "' is an llmpi run directory (it holds ", run, "); a Hugging Face export there would "
           "replace the run's config.json, which llmpi-sample, --resume and llmpi-export read. Give another --out, "
           "e.g. '", out, "-hf' (--overwrite does not apply to a run directory)");
    const fs::path cwd = fs::current_path(ec);
    if (!ec) {
      const fs::path rel = fs::weakly_canonical(cwd, ec).lexically_relative(fs::weakly_canonical(p, ec));
      if (!rel.empty() && *rel.begin() != "..")
        fail("--out '", out, "' is the working directory or holds it; give a new directory for the export");
    }
    const std::vector<std::string> names = entries_of(p);
    e.out_exists = true;
    if (!names.empty()) {
      // An earlier llmpi export: its record lists every file in it.
      const json rec = read_json_object(p / kExportRecord);
      std::vector<std::string> ours = {kExportRecord};
      const bool is_export = !rec.is_discarded() && rec.value("format", "") == "llmpi-export" &&
                             rec.contains("files") && rec["files"].is_array();
      if (is_export)
        for (const json& f : rec["files"])
          if (f.is_string()) ours.push_back(f.get<std::string>());
      std::vector<std::string> foreign;
      for (const std::string& n : names)
        if (std::find(ours.begin(), ours.end(), n) == ours.end()) foreign.push_back(n);
      if (!foreign.empty()) {
        if (!overwrite) {
          std::string hf;
          const bool is_model = is_hf_export_dir(e.out, &hf);
          fail("--out '", out, "' is not empty: it holds ", list_names(names),
               is_export ? " (an earlier llmpi export, and files it did not write: " + list_names(foreign) + ")"
               : is_model ? " (" + hf + ", not written by llmpi-export)"
                          : "",
               ". llmpi-export writes into a new or empty directory or over its own earlier export: give another "
               "--out, or pass --overwrite to move what it holds to '", e.out, ".previous-<date>' and write the "
               "export in its place");
        }
        e.keep_previous = true;
      }
    }
  }
  // The staging directory, beside out (same file system, so the swap is a rename).
  const fs::path parent = p.parent_path();
  fs::create_directories(parent, ec);
  if (ec) fail("cannot create '", parent.string(), "': ", ec.message(), "; choose a writable --out directory");
  const fs::path staging = unused(parent.string() + "/." + p.filename().string() + ".tmp-" + std::to_string(getpid()));
  fs::create_directory(staging, ec);
  if (ec) fail("cannot create '", staging.string(), "': ", ec.message(), "; choose a writable --out directory");
  e.staging = staging.string();
}

std::string commit_export_dir(ExportDir& e, json record) {
  if (e.staging.empty() || e.committed) fail("internal: commit_export_dir on an export that is not open");
  std::vector<std::string> files = entries_of(e.staging);
  files.erase(std::remove(files.begin(), files.end(), kExportRecord), files.end());
  record["format"] = "llmpi-export";
  record["version"] = 1;
  record["files"] = files;
  write_file_atomic(e.staging + "/" + kExportRecord, record.dump(2) + "\n");

  const fs::path out = e.out, staging = e.staging;
  std::error_code ec;
  if (!e.out_exists) {
    // A directory that appeared meanwhile: rename onto an empty one succeeds, a full one fails.
    rename_or_fail(staging, out);
    e.committed = true;
    return "";
  }
  // The earlier contents end where `aside` says: kept (--overwrite) or removed (an empty directory
  // or an earlier export).
  const fs::path aside = e.keep_previous ? unused(e.out + ".previous-" + utc_stamp())
                                         : unused(e.staging + ".old");
  if (exchange(staging, out)) {
    e.committed = true;  // out is the export; staging holds the earlier contents
    rename_or_fail(staging, aside);
  } else {
    rename_or_fail(out, aside);
    rename_or_fail(staging, out);
    e.committed = true;
  }
  if (!e.keep_previous) {
    fs::remove_all(aside, ec);
    return "";
  }
  return aside.string();
}

}  // namespace llmpi
