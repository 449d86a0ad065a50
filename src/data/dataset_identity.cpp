// Dataset identity, the train/val checks and llmpi-prep's manifest. Contract: dataset_identity.h.
#include "data/dataset_identity.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "data/classification_file.h"
#include "data/h5_util.h"
#include "data/path_util.h"
#include "data/token_file.h"
#include "runtime/error.h"

namespace llmpi {

nlohmann::json DatasetIdentity::json() const {
  return {{"kind", kind}, {"tokenizer", tokenizer}, {"content_fnv1a64", content_hash}, {"size", size}};
}

std::string DatasetIdentity::text() const {
  return "tokenizer '" + tokenizer + "', content fnv1a64 " + (content_hash.empty() ? "(none)" : content_hash) +
         ", " + std::to_string(size) + (kind == "classification" ? " examples" : " tokens");
}

DatasetIdentity dataset_identity(const TokenFileInfo& info) {
  DatasetIdentity d;
  d.path = info.path;
  d.kind = "tokens";
  d.tokenizer = info.tokenizer;
  d.content_hash = info.content_hash;
  d.size = info.n_tokens;
  return d;
}

DatasetIdentity dataset_identity(const ClassificationInfo& info) {
  DatasetIdentity d;
  d.path = info.path;
  d.kind = "classification";
  d.tokenizer = info.tokenizer;
  d.content_hash = info.content_hash;
  d.size = info.n_examples;
  return d;
}

std::vector<std::string> leftover_prep_files(const std::string& dir) {
  std::optional<PrepManifest> m;
  try {
    m = read_prep_manifest(dir);
  } catch (const Error&) {
  }
  const std::vector<std::string> named = m ? m->files() : std::vector<std::string>();
  std::vector<std::string> found;
  DIR* d = opendir(dir.c_str());
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == kPrepManifestName) continue;
    if (std::find(named.begin(), named.end(), name) != named.end()) continue;
    if (ends_with(name, ".h5.new") || ends_with(name, ".h5.new.tmp") ||
        name == std::string(kPrepManifestName) + ".tmp" || name == kPrepWorkDirName ||
        (m && m->version == kPrepManifestVersion && is_prep_output(dir, name)))
      found.push_back(join_path(dir, name));
  }
  closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> check_training_data(const DatasetIdentity& train, const DatasetIdentity* val) {
  if (val && val->tokenizer != train.tokenizer)
    fail("the training file '", train.path, "' and the validation file '", val->path,
         "' were made by different tokenizers ('", train.tokenizer, "' and '", val->tokenizer,
         "'), so val_loss would be meaningless; make both with the same tokenizer (one llmpi-prep run "
         "writes a matching train.h5 and val.h5)");
  struct stat st;
  if (val && ::stat(val->path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && !val->content_hash.empty() &&
      val->content_hash == train.content_hash && val->size == train.size)
    fail("the validation data '", val->path, "' is a data set directory, which names its train split, and that "
         "is the training data '", train.path, "'; give its validation split as '", join_path(val->path, "val"), "'");

  std::vector<std::string> warnings;
  std::set<std::string> dirs_seen;
  for (const DatasetIdentity* d : {&train, val}) {
    if (!d) continue;
    if (d->content_hash.empty())
      warnings.push_back("'" + d->path + "' has no content hash (no content_fnv1a64 attribute), so "
                         "its identity is its tokenizer and size only; remake it with llmpi-prep to record one");
    const bool is_dir = ::stat(d->path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    const std::string dir = is_dir ? d->path : dir_of(d->path);
    const std::string manifest_path = join_path(dir, kPrepManifestName);
    std::vector<std::string> leftovers = leftover_prep_files(dir);
    std::string leftover_text;
    for (const std::string& f : leftovers) leftover_text += (leftover_text.empty() ? "" : ", ") + f;
    if (dirs_seen.insert(dir).second && !leftovers.empty())
      warnings.push_back("found " + leftover_text + " in '" + dir +
                         "': an llmpi-prep run into this directory was interrupted; rerun it, or delete them");

    // A version 2 manifest was followed by the reader, which checked every file against it.
    std::optional<PrepManifest> m = read_prep_manifest(dir);
    if (!m || m->version != 1) continue;
    const auto want = m->v1_files.find(base_of(d->path));
    if (want == m->v1_files.end() || d->content_hash == want->second) continue;
    fail("'", d->path, "' is not the file that '", manifest_path, "' names (its content fnv1a64 is ",
         d->content_hash.empty() ? "(none)" : d->content_hash, ", the manifest's ", want->second,
         "): an llmpi-prep run into '", dir, "' was interrupted while replacing the data set",
         leftovers.empty() ? std::string() : " (it left " + leftover_text + ")",
         ", so its files may come from different runs; rerun llmpi-prep (or delete ", manifest_path,
         " if you replaced the file on purpose)");
  }
  return warnings;
}

void write_prep_manifest(const std::string& dir, const std::vector<DatasetIdentity>& files,
                         const std::string& created_by) {
  nlohmann::json m = {{"format", kPrepManifestFormat}, {"version", 1}, {"created_by", created_by}};
  m["tokenizer"] = files.empty() ? std::string() : files.front().tokenizer;
  m["files"] = nlohmann::json::object();
  for (const DatasetIdentity& d : files) m["files"][base_of(d.path)] = d.json();
  write_manifest_file(dir, m.dump(2) + "\n");
}

}  // namespace llmpi
