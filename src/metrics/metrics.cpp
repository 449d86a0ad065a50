#include "metrics/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

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
