// Shared by the file-format tests: a fixture with a fresh temporary directory, and a check that an
// expression throws an llmpi::Error whose message contains a text.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "runtime/error.h"

namespace llmpi::test {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end.
struct TempDirTest : testing::Test {
  std::string dir;
  void SetUp() override {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/llmpi-test-XXXXXX";
    ASSERT_NE(mkdtemp(&tmpl[0]), nullptr) << "mkdtemp failed for " << tmpl;
    dir = tmpl;
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
