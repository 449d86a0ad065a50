#include "runtime/host_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace llmpi {

std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB", b / 1e3);
  return buf;
}

namespace {

// A number from a one-line file ("max" = no limit: -1).
double read_number_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s)) return -1;
  if (s == "max") return -1;
  try {
    return std::stod(s);
  } catch (...) {
    return -1;
  }
}

// This process's memory cgroup path from /proc/self/cgroup: v2 ("0::/path") or v1 ("N:memory:/path").
std::string cgroup_path(bool v2) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (v2 && line.rfind("0::", 0) == 0) return line.substr(3);
    if (!v2) {
      auto a = line.find(':'), b = line.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      std::string ctrls = "," + line.substr(a + 1, b - a - 1) + ",";
      if (ctrls.find(",memory,") != std::string::npos) return line.substr(b + 1);
    }
  }
  return "";
}

}  // namespace

double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      double kb = -1;
      in >> kb;
      return kb * 1024;
    }
    std::getline(in, key);
  }
  return -1;
}

double host_memory_available(std::string* source) {
  double avail = -1;
  std::string from = "MemAvailable";
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    double kb;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemAvailable:") avail = kb * 1024;
    }
  }
  // A memory cgroup's limit, less what the group uses, when it is tighter. The limit files are
  // looked for at the group's own path and at the mount root (a container sees its own group there).
  // Usage counts the page cache, which the kernel reclaims before it kills: like container
  // runtimes, count the inactive file pages (memory.stat) as free.
  auto stat_value = [](const std::string& path, const char* key) {
    std::ifstream in(path);
    std::string k;
    double v;
    while (in >> k >> v)
      if (k == key) return v;
    return 0.0;
  };
  auto consider = [&](double limit, double usage, const std::string& what) {
    if (limit <= 0 || limit > 1e18 || usage < 0) return;
    const double left = std::max(0.0, limit - usage);
    if (avail < 0 || left < avail) avail = left, from = what;
  };
  const std::string p2 = cgroup_path(true);
  for (const std::string& dir : {"/sys/fs/cgroup" + p2, std::string("/sys/fs/cgroup")}) {
    const double lim = read_number_file(dir + "/memory.max");
    if (lim > 0) {
      consider(lim, read_number_file(dir + "/memory.current") - stat_value(dir + "/memory.stat", "inactive_file"),
               "cgroup memory.max");
      break;
    }
  }
  const std::string p1 = cgroup_path(false);
  for (const std::string& dir : {"/sys/fs/cgroup/memory" + p1, std::string("/sys/fs/cgroup/memory")}) {
    const double lim = read_number_file(dir + "/memory.limit_in_bytes");
    if (lim > 0) {
      consider(lim,
               read_number_file(dir + "/memory.usage_in_bytes") - stat_value(dir + "/memory.stat", "total_inactive_file"),
               "cgroup memory.limit_in_bytes");
      break;
    }
  }
  if (source) *source = from;
  return avail;
}

}  // namespace llmpi
