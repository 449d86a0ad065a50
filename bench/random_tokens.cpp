// bench-random_tokens: a token file of uniformly random ids, for throughput benchmarks at any
// vocabulary size (the reference configuration uses vocab 4096, which no shipped tokenizer has).
//   bench-random_tokens --out FILE --vocab V --tokens N [--seed S]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "data/token_file.h"
#include "runtime/error.h"
#include "runtime/rng.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a token file of uniformly random ids (for benchmarks)."};
  std::string out;
  int64_t vocab = 4096, n = 1 << 20;
  uint64_t seed = 1;
  app.add_option("--out", out, "output .h5 path")->required();
  app.add_option("--vocab", vocab, "vocabulary size")->check(CLI::Range(2, 1 << 30));
  app.add_option("--tokens", n, "number of tokens")->check(CLI::Range((int64_t)2, (int64_t)1 << 40));
  app.add_option("--seed", seed, "PRNG seed");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<uint32_t> toks(n);
    llmpi::Rng rng(seed);
    for (auto& t : toks) t = (uint32_t)rng.below((uint64_t)vocab);
    llmpi::write_token_file(out, toks, {vocab, vocab - 1, "random", "bench-random_tokens"});
    std::printf("wrote %s: %lld random tokens, vocab %lld\n", out.c_str(), (long long)n, (long long)vocab);
  } catch (const llmpi::Error& e) {
    std::fprintf(stderr, "bench-random_tokens: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
