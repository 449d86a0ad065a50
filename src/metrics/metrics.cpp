#include "metrics/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace llmpi {

JsonlWriter::JsonlWriter(const std::string& path, bool append) {
  f = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f) fail("cannot write '", path, "': ", std::strerror(errno), " (check run.dir)");
}

JsonlWriter::~JsonlWriter() {
  if (f) std::fclose(f);
}

void JsonlWriter::write(const nlohmann::json& j) {
  if (!f) return;
  std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), f);
  std::fflush(f);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  long t = (long)(s + 0.5);
  char buf[64];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) fail("cannot write '", tmp, "': ", std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(errno));
  }
}

}  // namespace llmpi
