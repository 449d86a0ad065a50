// Path pieces for the data code's messages and file names (plain strings, '/' separators).
#pragma once
#include <string>

namespace llmpi {

// "a/b/c.h5" -> "a/b"; "c.h5" -> "."; "/c.h5" -> "/".
inline std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
// "a/b/c.h5" -> "c.h5".
inline std::string base_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
// ("a/b", "c.h5") -> "a/b/c.h5"; (".", "c.h5") -> "c.h5".
inline std::string join_path(const std::string& dir, const std::string& name) {
  return dir == "." ? name : !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}
inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace llmpi
