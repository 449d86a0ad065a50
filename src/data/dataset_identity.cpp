// Dataset identity, the train/val checks and llmpi-prep's manifest. Contract: dataset_identity.h.
#include "data/dataset_identity.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "data/classification_file.h"
#include "data/h5_util.h"
#include "data/token_file.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
std::string base_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
std::string join(const std::string& dir, const std::string& name) {
  return dir == "." ? name : dir + "/" + name;
}
bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

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
  std::vector<std::string> found;
  DIR* d = opendir(dir.c_str());
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (ends_with(name, ".h5.new") || ends_with(name, ".h5.new.tmp") ||
        name == std::string(kPrepManifestName) + ".tmp")
      found.push_back(join(dir, name));
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

  std::vector<std::string> warnings;
  std::set<std::string> dirs_seen;
  for (const DatasetIdentity* d : {&train, val}) {
    if (!d) continue;
    if (d->content_hash.empty())
      warnings.push_back("'" + d->path + "' has no content hash (it was made before llmpi recorded one), so "
                         "its identity is its tokenizer and size only; remake it with llmpi-prep to record one");
    const std::string dir = dir_of(d->path);
    const std::string manifest_path = join(dir, kPrepManifestName);
    std::vector<std::string> leftovers = leftover_prep_files(dir);
    std::string leftover_text;
    for (const std::string& f : leftovers) leftover_text += (leftover_text.empty() ? "" : ", ") + f;
    if (dirs_seen.insert(dir).second && !leftovers.empty())
      warnings.push_back("found " + leftover_text + " in '" + dir +
                         "': an llmpi-prep run into this directory was interrupted; rerun it, or delete them");

    std::ifstream in(manifest_path);
    if (!in) continue;  // not made by llmpi-prep (or by one before manifests): nothing to compare with
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json m = nlohmann::json::parse(ss.str(), nullptr, false);
    if (m.is_discarded() || !m.is_object())
      fail("'", manifest_path, "' (llmpi-prep's list of the files in '", dir,
           "') is not valid JSON; rerun llmpi-prep to write the data set again");
    if (m.value("format", "") != kPrepManifestFormat || !m.contains("files") || !m["files"].is_object())
      continue;  // someone else's manifest.json
    const std::string base = base_of(d->path);
    if (!m["files"].contains(base)) continue;
    const nlohmann::json& want = m["files"][base];
    const std::string want_hash = want.is_object() ? want.value("content_fnv1a64", "") : "";
    if (d->content_hash == want_hash) continue;
    fail("'", d->path, "' is not the file that '", manifest_path, "' names (its content fnv1a64 is ",
         d->content_hash.empty() ? "(none)" : d->content_hash, ", the manifest's ", want_hash,
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
  const std::string path = join(dir, kPrepManifestName), tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  const std::string text = m.dump(2) + "\n";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write '", tmp, "': ", std::strerror(errno), "; check the permissions of '", dir, "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok)
    fail("cannot write '", tmp, "': ", std::strerror(ok ? errno : err), "; check the disk space of '", dir, "'");
  h5::commit_tmp_file(tmp, path, guard);
}

}  // namespace llmpi
