// libFuzzer target: the safetensors header parser and value conversion (src/hf/safetensors.cpp)
// on arbitrary bytes, taken as a whole file.
//
// Contract checked:
//   - the only exception parse_safetensors_header may throw is llmpi::Error (anything else, a
//     crash, an out-of-bounds read or undefined behaviour is a bug);
//   - an accepted header describes tensors that lie inside the file, after the header, do not
//     overlap, and whose byte ranges are exactly numel × the dtype's size;
//   - every float tensor converts to float (ASan checks the reads stay in the buffer), and
//     writing the converted tensors as F32 and parsing that again gives the same names, shapes
//     and bits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hf/safetensors.h"
#include "runtime/error.h"

using namespace llmpi;

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so ASan sees any read past the end.
  std::vector<uint8_t> file(data, data + size);
  StHeader h;
  try {
    h = parse_safetensors_header(file.data(), file.size(), "fuzz.safetensors");
  } catch (const Error&) {
    return 0;
  }
  size_t prev_end = h.data_start;
  std::vector<std::vector<float>> values;
  std::vector<StWriteTensor> out;
  values.reserve(h.tensors.size());
  for (const StTensor& t : h.tensors) {
    if (t.begin < h.data_start || t.end < t.begin || t.end > size) bug("tensor " + t.name + " outside the data buffer");
    if (t.begin < prev_end) bug("tensor " + t.name + " overlaps the previous one");
    prev_end = t.end;
    if (t.numel() * st_dtype_size(t.dtype) != t.end - t.begin) bug("tensor " + t.name + ": size and range disagree");
    if (!st_dtype_is_float(t.dtype)) continue;
    values.emplace_back(t.numel());
    st_to_float(t.dtype, file.data() + t.begin, t.numel(), values.back().data());
    out.push_back({t.name, t.shape, values.back().data()});
  }
  std::string again;
  try {
    again = safetensors_bytes(out, h.metadata);
  } catch (const Error& e) {
    bug(std::string("could not write back what was read: ") + e.what());
  }
  StHeader h2;
  try {
    h2 = parse_safetensors_header(reinterpret_cast<const uint8_t*>(again.data()), again.size(), "again");
  } catch (const Error& e) {
    bug(std::string("our own file does not parse: ") + e.what());
  }
  if (h2.tensors.size() != out.size() || h2.metadata != h.metadata) bug("the rewritten file lists other tensors");
  for (const StWriteTensor& w : out) {
    const StTensor* t = h2.find(w.name);
    if (!t || t->shape != w.shape || t->dtype != StDtype::F32) bug("tensor " + w.name + " changed on rewrite");
    if (t->end > t->begin && std::memcmp(again.data() + t->begin, w.data, t->end - t->begin) != 0)
      bug("tensor " + w.name + " changed bits");
  }
  return 0;
}
