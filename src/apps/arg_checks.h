// Shared by the program mains: parsing the command line, range checks of numeric options, and
// one-line error text. A value outside its range is an Error naming the flag, the accepted range, what the value
// means and what was given, e.g. "--pp must be >= 1 (pipeline stages), got -2"; the main prints it
// as its one error line and exits non-zero.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "runtime/error.h"

namespace llmpi {

// value in [lo, hi] (hi = the type's maximum: no upper bound), else Error.
template <typename T>
void require_range(const char* flag, T value, T lo, T hi, const char* meaning) {
  if (value >= lo && value <= hi) return;
  std::ostringstream range;
  if (hi == std::numeric_limits<T>::max())
    range << ">= " << lo;
  else if (hi == lo + 1)
    range << lo << " or " << hi;
  else
    range << "in [" << lo << ", " << hi << "]";
  fail(flag, " must be ", range.str(), " (", meaning, "), got ", value);
}

template <typename T>
void require_at_least(const char* flag, T value, T lo, const char* meaning) {
  require_range(flag, value, lo, std::numeric_limits<T>::max(), meaning);
}

// An unsigned 64-bit value written in decimal digits. (CLI11 reads "-1" into a uint64_t as
// 2^64 - 1 and clamps a larger number, so such options are taken as text and read here.)
inline uint64_t parse_u64(const char* flag, const std::string& text, const char* meaning) {
  uint64_t v = 0;
  bool ok = !text.empty() && text.size() <= 20;
  for (char c : text) {
    if (c < '0' || c > '9' || v > (std::numeric_limits<uint64_t>::max() - (c - '0')) / 10) {
      ok = false;
      break;
    }
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!ok)
    fail(flag, " must be an integer in [0, ", std::numeric_limits<uint64_t>::max(), "] (", meaning, "), got '", text,
         "'");
  return v;
}

// A message on one line (the mains print errors as one line).
inline std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// Parses the command line. Returns -1 when the program goes on; otherwise the status to exit
// with: 0 after --help (printed), `bad_status` after one line "PROGRAM: error: ...; see PROGRAM
// --help" on stderr.
inline int parse_command_line(CLI::App& app, int argc, char** argv, const char* program, int bad_status) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "%s: error: %s; see %s --help\n", program, one_line(e.what()).c_str(), program);
    return bad_status;
  }
  return -1;
}

}  // namespace llmpi
