// Writes the seed corpus of token_file_fuzz into DIR: small valid token files made by
// write_token_file (uint16 and uint32 storage, empty, one token, a few chunks' worth) and
// truncations of them. Usage: make-token-seeds DIR
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "runtime/error.h"

using namespace llmpi;

static std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

static void put(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make-token-seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  struct Seed {
    const char* name;
    std::vector<uint32_t> tokens;
    TokenFileAttrs attrs;
  };
  std::vector<uint32_t> text;
  for (int i = 0; i < 300; i++) text.push_back(uint32_t("hello, token file fuzzing\n"[i % 26]));
  text.push_back(256);
  std::vector<uint32_t> wide;
  for (uint32_t i = 0; i < 64; i++) wide.push_back(i * 1009 % 70000);
  const Seed seeds[] = {
      {"byte", text, {257, 256, "byte", "llmpi-prep"}},
      {"empty", {}, {257, 256, "byte", "llmpi-prep"}},
      {"one", {7}, {8, 0, "byte", ""}},
      {"gpt2", {15496, 11, 995, 50256}, {50257, 50256, "gpt2:fnv1a64=0123456789abcdef", "llmpi-prep"}},
      {"u32", wide, {70000, 69999, "custom", "make-token-seeds"}},
  };
  try {
    for (const Seed& s : seeds) {
      std::string p = dir + "/" + s.name + ".h5";
      write_token_file(p, s.tokens, s.attrs);
      std::string bytes = slurp(p);
      // Truncations: HDF5 finds the superblock, then runs out of file at different places.
      for (size_t cut : {size_t(8), size_t(96), size_t(512), bytes.size() / 2, bytes.size() - 1})
        if (cut < bytes.size()) put(dir + "/" + s.name + "-trunc" + std::to_string(cut) + ".h5", bytes.substr(0, cut));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "make-token-seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
