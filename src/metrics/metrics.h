// Metrics output: JSON Lines files (metrics.jsonl, eval.jsonl) and atomic small-file writes.
#pragma once
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace llmpi {

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

// Write text to path atomically: path.tmp, flush, rename. Throws Error naming the path.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace llmpi
