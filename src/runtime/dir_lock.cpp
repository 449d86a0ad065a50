// A directory's owner. Contract: dir_lock.h.
#include "runtime/dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "runtime/clock.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
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

}  // namespace

DirLock::~DirLock() {
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

std::unique_ptr<DirLock> lock_dir(const std::string& dir, const std::string& name, const DirLockWords& w,
                                  bool probe_only, std::vector<std::string>& notes) {
  const std::string path = dir + "/" + name;
  for (int attempt = 0; attempt < 5; attempt++) {
    if (probe_only && !exists(path)) return nullptr;
    int fd = open(path.c_str(), (probe_only ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (probe_only) return nullptr;
      fail("cannot create the ", w.kind, "'s lock file '", path, "': ", std::strerror(errno), "; choose a writable ",
           w.setting);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK && err != EINTR) {
        // No lock support on this file system (some NFS and Lustre mounts): go on, and say so.
        close(fd);
        if (probe_only) return nullptr;
        notes.push_back("warning: the file system of '" + dir + "' does not support file locks (flock: " +
                        std::strerror(err) + "): a second " + w.user + " started in this directory will not be detected");
        auto lock = std::make_unique<DirLock>();
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
      fail(w.setting, " '", dir, "' is in use by another ", w.user, " (", describe_holder(holder), "; lock file ", path,
           "): ", w.clash, ". Wait for that ", w.user, " to end, or choose another ", w.setting,
           "; if that process is gone (its node crashed), delete ", path);
    }
    if (probe_only) {
      const auto holder = read_holder(fd);
      if (holder.count("pid"))
        notes.push_back("the " + w.kind + " lock left by " + describe_holder(holder) + " (" + w.a_user +
                        " that ended without removing it) would be taken over");
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
      notes.push_back("taking over the " + w.kind + " lock left by " + describe_holder(holder) + ", " + w.a_user +
                      " that ended without releasing it");
    const std::string text = "host " + host_name() + "\npid " + std::to_string(getpid()) + "\nstarted " +
                             utc_now("%Y-%m-%dT%H:%M:%SZ") + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) != (ssize_t)text.size() || fsync(fd) != 0) {
      const int err = errno;
      close(fd);
      fail("cannot write the lock file '", path, "': ", std::strerror(err), "; check the space on ", w.setting,
           "'s disk");
    }
    auto lock = std::make_unique<DirLock>();
    lock->path = path;
    lock->fd = fd;
    return lock;
  }
  fail("cannot take the lock '", path, "': it keeps being replaced by another process; check who else uses ",
       w.setting);
}

}  // namespace llmpi
