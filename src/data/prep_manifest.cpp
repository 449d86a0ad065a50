// llmpi-prep's data set directory: manifest, split names, output directory rules. Contract:
// prep_manifest.h.
#include "data/prep_manifest.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/classification_file.h"
#include "data/content_hash.h"
#include "data/h5_util.h"
#include "data/path_util.h"
#include "data/token_file.h"
#include "runtime/error.h"

namespace llmpi {

namespace fs = std::filesystem;

namespace {

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}
uint64_t hex16_value(const std::string& s) { return std::stoull(s, nullptr, 16); }

// A file name inside the data set directory: no directories, nothing hidden.
bool is_plain_name(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s[0] != '.';
}

std::string split_names(const PrepManifest& m) {
  std::string s;
  for (const auto& kv : m.splits) s += (s.empty() ? "" : ", ") + kv.first;
  return s;
}

// What llmpi-prep's lock messages call things (runtime/dir_lock.h).
const DirLockWords kPrepOutWords = {
    "--out", "output directory", "llmpi-prep run", "an llmpi-prep run",
    "two llmpi-prep runs on one --out would delete each other's work files and mix or destroy their data sets"};

[[noreturn]] void damaged(const std::string& path, const std::string& what) {
  fail("'", path, "' (llmpi-prep's manifest) is damaged: ", what,
       "; rerun llmpi-prep to write the data set again");
}

PrepManifest parse_v2(const nlohmann::json& j, const std::string& path) {
  PrepManifest m;
  m.version = 2;
  auto int_of = [&](const nlohmann::json& o, const char* key) -> int64_t {
    if (!o.contains(key) || !o[key].is_number_integer()) damaged(path, std::string("no integer '") + key + "'");
    return o[key].get<int64_t>();
  };
  auto str_of = [&](const nlohmann::json& o, const char* key) -> std::string {
    if (!o.contains(key) || !o[key].is_string()) damaged(path, std::string("no string '") + key + "'");
    return o[key].get<std::string>();
  };
  m.generation = int_of(j, "generation");
  m.tokenizer = str_of(j, "tokenizer");
  m.created_by = j.value("created_by", "");
  m.vocab_size = int_of(j, "vocab_size");
  m.eot_id = int_of(j, "eot_id");
  if (m.generation < 1) damaged(path, "its generation is below 1");
  if (m.vocab_size <= 0 || m.eot_id < -1 || m.eot_id >= m.vocab_size)
    damaged(path, "vocab_size / eot_id out of range");
  if (!j.contains("splits") || !j["splits"].is_object() || j["splits"].empty())
    damaged(path, "it lists no splits");
  for (const auto& [name, s] : j["splits"].items()) {
    if (!is_plain_name(name) || !s.is_object()) damaged(path, "split '" + name + "' is not an object");
    SplitEntry e;
    e.kind = str_of(s, "kind");
    if (e.kind != kTokensSplitKind && e.kind != kClassificationSplitKind)
      damaged(path, "split '" + name + "' has kind '" + e.kind + "', not tokens or classification");
    if (e.kind == kTokensSplitKind && m.eot_id < 0) damaged(path, "a token split without an eot_id");
    e.content_hash = str_of(s, "content_fnv1a64");
    e.size = int_of(s, "size");
    e.documents = int_of(s, "documents");
    if (!s.contains("shards") || !s["shards"].is_array() || s["shards"].empty())
      damaged(path, "split '" + name + "' lists no shards");
    int64_t total = 0;
    for (const nlohmann::json& sh : s["shards"]) {
      if (!sh.is_object()) damaged(path, "a shard of split '" + name + "' is not an object");
      ShardEntry se;
      se.file = str_of(sh, "file");
      se.tokens = int_of(sh, "tokens");
      se.content_hash = str_of(sh, "content_fnv1a64");
      if (!is_plain_name(se.file)) damaged(path, "shard file '" + se.file + "' is not a name in its directory");
      if (se.tokens < 0 || !is_hex16(se.content_hash))
        damaged(path, "shard '" + se.file + "' has a negative size or a malformed content hash");
      total += se.tokens;
      e.shards.push_back(se);
    }
    if (total != e.size)
      damaged(path, "split '" + name + "' has size " + std::to_string(e.size) + " but its shards hold " +
                        std::to_string(total) + " tokens");
    if (e.content_hash != split_content_hash(e.shards))
      damaged(path, "split '" + name + "' has content hash " + e.content_hash +
                        ", which is not the hash of its shard list");
    m.splits[name] = std::move(e);
  }
  return m;
}

}  // namespace

std::vector<std::string> PrepManifest::files() const {
  std::vector<std::string> out;
  for (const auto& kv : splits)
    for (const ShardEntry& s : kv.second.shards) out.push_back(s.file);
  for (const auto& kv : v1_files) out.push_back(kv.first);
  return out;
}

std::string split_content_hash(const std::vector<ShardEntry>& shards) {
  if (shards.size() == 1) return shards[0].content_hash;
  Fnv1a64 h;
  for (const ShardEntry& s : shards) {
    h.add_u64_le(uint64_t(s.tokens));
    h.add_u64_le(is_hex16(s.content_hash) ? hex16_value(s.content_hash) : 0);
  }
  return h.hex();
}

std::string shard_file_name(const std::string& split, int64_t index, int64_t n_shards, int64_t generation) {
  std::string name = split;
  if (n_shards > 1) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "-%05lld", (long long)index);
    name += buf;
  }
  if (generation > 1) name += ".g" + std::to_string(generation);
  return name + ".h5";
}

std::optional<PrepManifest> read_prep_manifest(const std::string& dir) {
  const std::string path = join_path(dir, kPrepManifestName);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    fail("cannot read '", path, "': ", std::strerror(errno), "; check its permissions");
  }
  std::string text;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const bool read_error = std::ferror(f);
  std::fclose(f);
  if (read_error) fail("cannot read '", path, "': read error; check the file");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail("'", path, "' (llmpi-prep's list of the files in '", dir,
         "') is not valid JSON; rerun llmpi-prep to write the data set again");
  if (!j.contains("format") || !j["format"].is_string() || j["format"] != kPrepManifestFormat)
    return std::nullopt;  // someone else's manifest.json
  const int64_t version = j.value("version", int64_t(0));
  if (version == 1) {
    PrepManifest m;
    m.version = 1;
    m.generation = 1;
    m.tokenizer = j.value("tokenizer", "");
    m.created_by = j.value("created_by", "");
    if (j.contains("files") && j["files"].is_object())
      for (const auto& [name, f] : j["files"].items())
        m.v1_files[name] = f.is_object() ? f.value("content_fnv1a64", "") : "";
    return m;
  }
  if (version != kPrepManifestVersion)
    fail("'", path, "' has manifest version ", version, ", but this llmpi reads versions 1 and ",
         kPrepManifestVersion, "; use the llmpi that wrote it, or rerun this llmpi-prep");
  return parse_v2(j, path);
}

void write_prep_manifest_v2(const std::string& dir, const PrepManifest& m) {
  nlohmann::json j = {{"format", kPrepManifestFormat}, {"version", kPrepManifestVersion},
                      {"generation", m.generation},   {"created_by", m.created_by},
                      {"tokenizer", m.tokenizer},     {"vocab_size", m.vocab_size},
                      {"eot_id", m.eot_id}};
  j["splits"] = nlohmann::json::object();
  for (const auto& [name, s] : m.splits) {
    nlohmann::json shards = nlohmann::json::array();
    for (const ShardEntry& sh : s.shards)
      shards.push_back({{"file", sh.file}, {"tokens", sh.tokens}, {"content_fnv1a64", sh.content_hash}});
    j["splits"][name] = {{"kind", s.kind},   {"content_fnv1a64", s.content_hash}, {"size", s.size},
                         {"documents", s.documents}, {"shards", shards}};
  }
  write_manifest_file(dir, j.dump(1) + "\n");
}

void write_manifest_file(const std::string& dir, const std::string& text) {
  const std::string path = join_path(dir, kPrepManifestName), tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write '", tmp, "': ", std::strerror(errno), "; check the permissions of '", dir, "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok)
    fail("cannot write '", tmp, "': ", std::strerror(ok ? errno : err), "; check the disk space of '", dir, "'");
  h5::commit_tmp_file(tmp, path, guard);
}

void prep_crash_point(const char* name) {
  const char* at = std::getenv("LLMPI_PREP_TEST_CRASH");
  if (at && std::strcmp(at, name) == 0) {
    std::fflush(stdout);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
}

std::string TokenDataRef::manifest_path() const { return dir.empty() ? "" : join_path(dir, kPrepManifestName); }

TokenDataRef resolve_token_data(const std::string& given) {
  TokenDataRef r;
  r.path = given;
  std::string path = given;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat st;
  const bool exists = ::stat(path.c_str(), &st) == 0;
  auto follow = [&](const std::string& dir, PrepManifest m, const std::string& split) {
    r.dir = dir;
    r.split = split;
    for (const ShardEntry& s : m.splits.at(split).shards) r.files.push_back(join_path(dir, s.file));
    r.manifest = std::move(m);
    return r;
  };

  if (exists && S_ISDIR(st.st_mode)) {
    std::optional<PrepManifest> m = read_prep_manifest(path);
    if (!m)
      fail("data '", given, "' is a directory without an llmpi-prep manifest.json, so not a complete "
           "data set (llmpi-prep writes the manifest last; an interrupted run leaves none): rerun llmpi-prep, "
           "or give the path of a token file inside it");
    if (m->version == 1) {  // an older llmpi-prep's directory: DIR/train.h5
      if (!m->v1_files.count("train.h5"))
        fail("'", join_path(path, kPrepManifestName), "' names no train.h5; give the path of a token file inside '",
             given, "'");
      r.files = {join_path(path, "train.h5")};
      r.path = r.files[0];
      return r;
    }
    if (!m->splits.count("train"))
      fail("'", join_path(path, kPrepManifestName), "' has no train split (it has ", split_names(*m),
           "); name one as '", join_path(path, m->splits.begin()->first), "'");
    return follow(path, std::move(*m), "train");
  }

  const std::string dir = dir_of(path), base = base_of(path);
  std::optional<PrepManifest> m = read_prep_manifest(dir);
  const std::string stem = ends_with(base, ".h5") ? base.substr(0, base.size() - 3) : base;
  if (m && m->version == kPrepManifestVersion) {
    if (m->splits.count(stem)) return follow(dir, std::move(*m), stem);
    for (const auto& kv : m->splits)
      for (const ShardEntry& s : kv.second.shards)
        if (s.file == base) r.listed = s;
    if (!r.listed && !exists)
      fail("data '", given, "' does not exist, and '", join_path(dir, kPrepManifestName),
           "' has no split of that name (it has ", split_names(*m), "); name a split as '",
           join_path(dir, m->splits.begin()->first), "' or the directory '", dir, "' (its train split)");
    if (r.listed) {
      r.dir = dir;
      r.manifest = std::move(m);
    }
  } else if (m && !exists && m->v1_files.count(stem + ".h5")) {
    r.files = {join_path(dir, stem + ".h5")};
    r.path = r.files[0];
    return r;
  }
  r.files = {path};
  return r;
}

std::string manifest_format_of(const std::string& path) {
  try {
    TokenDataRef r = resolve_token_data(path);
    if (!r.split.empty())
      return r.split_entry()->kind == kTokensSplitKind ? kTokenFileFormat : kClassificationFileFormat;
  } catch (const Error&) {
  }
  return "";
}

bool is_prep_output(const std::string& dir, const std::string& name) {
  if (name == kPrepWorkDirName || name == std::string(kPrepManifestName) + ".tmp") return true;
  size_t i = 0;
  if (name.rfind("train", 0) == 0)
    i = 5;
  else if (name.rfind("val", 0) == 0 || name.rfind("dev", 0) == 0)
    i = 3;
  else
    return false;
  auto digits = [&](size_t from) {
    size_t j = from;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') j++;
    return j;
  };
  if (i < name.size() && name[i] == '-') {
    const size_t j = digits(i + 1);
    if (j != i + 6) return false;
    i = j;
  }
  if (name.compare(i, 2, ".g") == 0 && digits(i + 2) > i + 2) i = digits(i + 2);
  if (name.compare(i, 3, ".h5") != 0) return false;
  const std::string suffix = name.substr(i + 3);
  if (suffix == ".tmp" || suffix == ".new" || suffix == ".new.tmp") return true;
  if (!suffix.empty()) return false;
  const std::string path = join_path(dir, name);  // a final name: ours when llmpi-prep wrote it
  try {
    if (hdf5_format_of(path) == kClassificationFileFormat)
      return open_classification_file_info(path).created_by == "llmpi-prep glue";
    return open_single_token_file_info(path).created_by == "llmpi-prep";
  } catch (const Error&) {
    return false;
  }
}

PrepDestination open_prep_destination(const std::string& dir, bool overwrite, const std::vector<std::string>& inputs) {
  PrepDestination d;
  d.dir = dir;
  std::error_code ec;
  d.created = !fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail("cannot create output directory '", dir, "'", ec ? ": " + ec.message() : std::string(),
         "; choose a writable --out");
  try {
    d.lock = lock_dir(dir, kPrepLockName, kPrepOutWords, false, d.notes);
  } catch (const Error&) {
    if (d.created) fs::remove(dir, ec);  // (only when empty)
    throw;
  }
  try {
    d.manifest = read_prep_manifest(dir);
  } catch (const Error& e) {
    if (!overwrite)
      fail(e.what(), " (so '", dir, "' may hold files llmpi-prep did not make: choose another --out, or give "
           "--overwrite to write there anyway)");
  }
  std::vector<std::string> named = d.manifest ? d.manifest->files() : std::vector<std::string>();
  std::vector<std::string> foreign;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kPrepLockName || (d.manifest && name == kPrepManifestName)) continue;
    if (std::find(named.begin(), named.end(), name) != named.end()) continue;  // the current data set
    if (is_prep_output(dir, name)) {
      d.leftovers.push_back(join_path(dir, name));
      continue;
    }
    bool is_input = false;
    std::error_code eq;
    for (const std::string& in : inputs) is_input = is_input || fs::equivalent(e.path(), in, eq);
    if (!is_input) foreign.push_back(name);
  }
  if (ec) fail("cannot list output directory '", dir, "': ", ec.message(), "; check its permissions");
  std::sort(d.leftovers.begin(), d.leftovers.end());
  std::sort(foreign.begin(), foreign.end());
  if (!d.manifest && !foreign.empty() && !overwrite)
    fail("--out '", dir, "' is not empty and holds no llmpi-prep data set (it has '", foreign[0], "'",
         foreign.size() > 1 ? " and " + std::to_string(foreign.size() - 1) + " more" : std::string(),
         "); choose a new or empty directory, or give --overwrite to write there (llmpi-prep replaces only "
         "files with the names it writes)");
  d.next_generation = !d.manifest ? 1 : d.manifest->version == 1 ? 2 : d.manifest->generation + 1;
  return d;
}

}  // namespace llmpi
