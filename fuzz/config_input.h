// How config_fuzz reads its input: NUL-separated parts, the first the config text, the rest (at
// most 8) `--set` overrides. Shared with tests/test_fuzz_regressions.cpp, which replays findings.
#pragma once
#include <string>
#include <utility>
#include <vector>

inline std::pair<std::string, std::vector<std::string>> split_config_input(const std::string& in) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (true) {
    size_t z = in.find('\0', pos);
    parts.push_back(in.substr(pos, z == std::string::npos ? std::string::npos : z - pos));
    if (z == std::string::npos || parts.size() > 8) break;
    pos = z + 1;
  }
  return {parts[0], std::vector<std::string>(parts.begin() + 1, parts.end())};
}
