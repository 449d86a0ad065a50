// Errors: library code throws llmpi::Error with a message that names the problem and the fix.
// The program mains turn it into one clear line and a non-zero exit on every rank
// (see runtime/mpi_env.h: collective_check for start-up, fatal() for a single rank mid-run).
#pragma once
#include <stdexcept>
#include <string>

namespace llmpi {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throw an Error built from the arguments streamed together: fail("file ", path, " has no 'tokens'").
template <typename... Args>
[[noreturn]] void fail(const Args&... args);

}  // namespace llmpi

#include <sstream>
template <typename... Args>
[[noreturn]] void llmpi::fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}
