#include "train/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include "hf/export_dir.h"
#include "metrics/metrics.h"
#include "runtime/error.h"

namespace llmpi {

const char* const kRunFiles[] = {"config.json", "metrics.jsonl", "eval.jsonl", "comm_plan.json", "summary.json", "PREEMPTED",
                                 "checkpoints", nullptr};

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}


std::string utc_now(const char* fmt) {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, fmt, &tm);
  return buf;
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

// "host H\npid P\nstarted T\n" -> {host: H, pid: P, started: T}
std::map<std::string, std::string> read_holder(int fd) {
  std::map<std::string, std::string> kv;
  std::string text;
  char buf[512];
  ssize_t n;
  if (lseek(fd, 0, SEEK_SET) == 0)
    while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, (size_t)n);
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto sp = line.find(' ');
    if (sp != std::string::npos) kv[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return kv;
}

std::string describe_holder(const std::map<std::string, std::string>& h) {
  if (!h.count("pid")) return "another process";
  std::string s = "host " + (h.count("host") ? h.at("host") : std::string("?")) + ", pid " + h.at("pid");
  if (h.count("started")) s += ", started " + h.at("started");
  return s;
}

// Is the holder a process on this host that no longer exists?
bool holder_is_gone(const std::map<std::string, std::string>& h) {
  if (!h.count("host") || !h.count("pid") || h.at("host") != host_name()) return false;
  char* end = nullptr;
  const long pid = std::strtol(h.at("pid").c_str(), &end, 10);
  if (pid <= 0 || *end) return false;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

bool same_file(int fd, const std::string& path) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Take run.dir/LOCK (see run_dir.h). probe_only: report a holder but take nothing.
std::unique_ptr<RunDirLock> take_lock(const std::string& dir, bool probe_only, std::vector<std::string>& notes) {
  const std::string path = dir + "/LOCK";
  for (int attempt = 0; attempt < 5; attempt++) {
    if (probe_only && !exists(path)) return nullptr;
    int fd = open(path.c_str(), (probe_only ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (probe_only) return nullptr;
      fail("cannot create the run directory's lock file '", path, "': ", std::strerror(errno),
           "; choose a writable run.dir");
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK && err != EINTR) {
        // No lock support on this file system (some NFS and Lustre mounts): go on, and say so.
        close(fd);
        if (probe_only) return nullptr;
        notes.push_back("warning: the file system of '" + dir + "' does not support file locks (flock: " +
                        std::strerror(err) + "): a second run started in this directory will not be detected");
        auto lock = std::make_unique<RunDirLock>();
        lock->path = path;
        return lock;
      }
      const auto holder = read_holder(fd);
      close(fd);
      if (holder_is_gone(holder)) {
        // Held, but by a descriptor its dead owner left to another process: replace the file.
        notes.push_back("the lock on '" + dir + "' names " + describe_holder(holder) +
                        ", which no longer exists: taking it over");
        if (!probe_only && std::remove(path.c_str()) != 0 && errno != ENOENT)
          fail("cannot replace the stale lock file '", path, "': ", std::strerror(errno), "; delete it by hand");
        if (probe_only) return nullptr;
        continue;
      }
      fail("run.dir '", dir, "' is in use by another run (", describe_holder(holder), "; lock file ", path,
           "): two runs in one directory would mix their logs and checkpoints. Wait for that run to end, or "
           "choose another run.dir; if that process is gone (its node crashed), delete ", path);
    }
    if (probe_only) {
      const auto holder = read_holder(fd);
      if (holder.count("pid"))
        notes.push_back("the run directory lock left by " + describe_holder(holder) +
                        " (a run that ended without removing it) would be taken over");
      flock(fd, LOCK_UN);
      close(fd);
      return nullptr;
    }
    // We hold the lock on this inode; make sure the path still names it (a stale file may have been
    // replaced between our open and our flock).
    if (!same_file(fd, path)) {
      close(fd);
      continue;
    }
    const auto holder = read_holder(fd);
    if (holder.count("pid"))
      notes.push_back("taking over the run directory lock left by " + describe_holder(holder) +
                      ", a run that ended without releasing it");
    const std::string text = "host " + host_name() + "\npid " + std::to_string(getpid()) + "\nstarted " +
                             utc_now("%Y-%m-%dT%H:%M:%SZ") + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) != (ssize_t)text.size() || fsync(fd) != 0) {
      const int err = errno;
      close(fd);
      fail("cannot write the lock file '", path, "': ", std::strerror(err), "; check the space on run.dir's disk");
    }
    auto lock = std::make_unique<RunDirLock>();
    lock->path = path;
    lock->fd = fd;
    return lock;
  }
  fail("cannot take the lock '", path, "': it keeps being replaced by another process; check who else uses run.dir");
}

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

RunDirLock::~RunDirLock() {
  if (fd >= 0) {
    // Remove the file while still holding the lock, so that nobody reads a holder that is gone.
    std::remove(path.c_str());
    close(fd);
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
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
    if (n.rfind("trace-rank", 0) == 0 && n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0) names.push_back(n);
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
  c.lock = take_lock(dir, dry_run, c.notes);
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
