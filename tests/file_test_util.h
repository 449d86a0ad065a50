// Shared by the file-format tests: a fresh temporary directory (an object or a fixture), and a
// check that an expression throws an llmpi::Error whose message contains a text.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "runtime/error.h"

namespace llmpi::test {

// A fresh directory under $TMPDIR (or /tmp), named llmpi-test-XXXXXX; "" when none can be made.
inline std::string make_temp_dir() {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/llmpi-test-XXXXXX";
  return mkdtemp(&tmpl[0]) ? tmpl : std::string();
}

// make_temp_dir's directory, removed with everything in it when the object goes.
struct TempDir {
  std::string path = make_temp_dir();
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// The same as a fixture: `dir`, and path(name) inside it.
struct TempDirTest : testing::Test {
  std::string dir;
  void SetUp() override {
    dir = make_temp_dir();
    ASSERT_FALSE(dir.empty()) << "cannot make a temporary directory under $TMPDIR or /tmp";
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

// The message of the Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace llmpi::test

#define EXPECT_ERROR_HAS(expr, text)                                              \
  do {                                                                            \
    std::string msg_ = ::llmpi::test::error_of([&] { expr; });                    \
    EXPECT_NE(msg_.find(text), std::string::npos) << "message: " << msg_;         \
  } while (0)
