#include "train/run_dir.h"

#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hf/export_dir.h"
#include "metrics/metrics.h"
#include "runtime/clock.h"
#include "runtime/error.h"

namespace llmpi {

const char* const kRunFiles[] = {"config.json", "metrics.jsonl", "eval.jsonl", "comm_plan.json", "summary.json", "PREEMPTED",
                                 "checkpoints", nullptr};

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

int64_t count_lines(const std::string& path) {
  std::ifstream in(path);
  int64_t n = 0;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) n++;
  return n;
}

// What llmpi-train's lock messages call things (runtime/dir_lock.h).
const DirLockWords kRunDirWords = {"run.dir", "run directory", "run", "a run",
                                   "two runs in one directory would mix their logs and checkpoints"};

}  // namespace

void make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); i++) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        fail("cannot create run directory '", path, "' (at '", cur, "'): ", std::strerror(errno),
             "; choose a writable run.dir");
    }
    if (i < path.size()) cur += path[i];
  }
}

std::string new_lineage_id() {
  unsigned char b[8];
  if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {  // fall back on time and pid
    uint64_t x = (uint64_t)std::time(nullptr) * 6364136223846793005ull ^ (uint64_t)getpid() * 1442695040888963407ull;
    std::memcpy(b, &x, sizeof b);
  }
  char hex[17];
  for (int i = 0; i < 8; i++) std::snprintf(hex + 2 * i, 3, "%02x", b[i]);
  return hex;
}

std::string describe_existing_run(const std::string& dir) {
  std::vector<std::string> parts;
  int64_t n_ckpt = 0;
  long long newest = -1;
  for (const std::string& n : list_dir(dir + "/checkpoints")) {
    long long s = 0;
    char tail[8] = {0};
    if (std::sscanf(n.c_str(), "step-%lld.%7s", &s, tail) == 2 && std::string(tail) == "h5")
      n_ckpt++, newest = std::max(newest, s);
  }
  if (n_ckpt)
    parts.push_back(std::to_string(n_ckpt) + " checkpoint" + (n_ckpt > 1 ? "s" : "") + " (newest step " +
                    std::to_string(newest) + ")");
  for (const char* f : {"metrics.jsonl", "eval.jsonl"}) {
    const int64_t n = count_lines(dir + "/" + f);
    if (n > 0) parts.push_back(std::string(f) + " (" + std::to_string(n) + " line" + (n > 1 ? "s" : "") + ")");
  }
  std::string s;
  for (auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

std::string move_run_aside(const std::string& dir) {
  std::string aside = dir + "/previous-" + utc_now("%Y%m%d-%H%M%S");
  for (int k = 2; exists(aside); k++) aside = dir + "/previous-" + utc_now("%Y%m%d-%H%M%S") + "-" + std::to_string(k);
  if (mkdir(aside.c_str(), 0755) != 0)
    fail("--overwrite: cannot create '", aside, "': ", std::strerror(errno), "; check run.dir's permissions");
  std::vector<std::string> names;
  for (const char* const* f = kRunFiles; *f; f++) names.push_back(*f);
  for (const std::string& n : list_dir(dir))
    if ((n.rfind("trace-rank", 0) == 0 && n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0) ||
        n.rfind("events.out.tfevents.", 0) == 0)
      names.push_back(n);
  for (const std::string& n : names) {
    const std::string from = dir + "/" + n;
    if (!exists(from)) continue;
    if (std::rename(from.c_str(), (aside + "/" + n).c_str()) != 0)
      fail("--overwrite: cannot move '", from, "' into '", aside, "': ", std::strerror(errno),
           "; move the earlier run's files yourself, or choose another run.dir");
  }
  return aside;
}

RunDirClaim claim_run_dir(const std::string& dir, bool resuming, bool overwrite, bool dry_run) {
  RunDirClaim c;
  std::string model;
  if (is_hf_export_dir(dir, &model))  // (even with --overwrite: a model is not a run to move aside)
    fail("run.dir '", dir, "' holds ", model, ": a run would write its own config.json over the model's; choose "
         "another run.dir (a run can start from this model with --init-from ", dir, ")");
  if (!dry_run) make_dirs(dir);
  c.lock = lock_dir(dir, "LOCK", kRunDirWords, dry_run, c.notes);
  if (resuming) return c;
  const std::string earlier = describe_existing_run(dir);
  if (earlier.empty()) return c;
  if (!overwrite)
    fail("run.dir '", dir, "' already holds a run (", earlier, "), and a new run would overwrite its logs and "
         "prune its checkpoints: continue it with --resume auto, choose another run.dir, or pass --overwrite to "
         "move its files into ", dir, "/previous-<date>/ (nothing is deleted)");
  if (dry_run) {
    c.notes.push_back("--overwrite: the earlier run's files (" + earlier + ") would be moved into " + dir +
                      "/previous-<date>/");
    return c;
  }
  const std::string aside = move_run_aside(dir);
  c.notes.push_back("--overwrite: moved the earlier run's files (" + earlier + ") into " + aside);
  return c;
}

// Keep only the lines of a JSON Lines file whose "step" passes `keep` (a resumed run drops what
// the interrupted run logged after its last checkpoint, so each step appears once).
void trim_jsonl(const std::string& path, const std::function<bool(int64_t)>& keep) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, out;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && keep(j["step"].get<int64_t>())) out += line + "\n";
  }
  write_file_atomic(path, out);
}

}  // namespace llmpi
