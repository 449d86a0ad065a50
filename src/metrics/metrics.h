// Metrics output: a wall clock, JSON Lines files (metrics.jsonl, eval.jsonl), the median, and
// human formatting of durations.
#pragma once
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llmpi {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Appends one JSON object per line, flushed after each, so a killed job keeps what it logged.
struct JsonlWriter {
  FILE* f = nullptr;
  JsonlWriter() = default;
  // Truncates the file, or appends with append = true. Throws Error if it cannot be opened.
  explicit JsonlWriter(const std::string& path, bool append = false);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  void write(const nlohmann::json& j);
};

double median(std::vector<double> v);  // 0 for an empty vector
std::string format_duration(double seconds);  // "2m31s", "1h04m", "45s"

// Write text to path atomically: path.tmp, flush, rename. Throws Error naming the path.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace llmpi
