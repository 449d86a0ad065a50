// bench-random_examples: a classification file (data/classification_file.h) of random examples,
// for model.family bert throughput benchmarks at any vocabulary size and sequence length.
//   bench-random_examples --out FILE --vocab V --seq-len L --examples N [--labels K] [--seed S]
// Every example is full length (attention_mask all 1, so the attention skips no padding and the
// work per step is the B x L tokens the FLOP count assumes): token 1 as [CLS] at position 0, then
// uniformly random ids in [2, V); token types 0 for the first half and 1 for the second (a
// sentence pair); a uniformly random label in [0, K).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "data/classification_file.h"
#include "runtime/error.h"
#include "runtime/rng.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a classification file of random full-length examples (for benchmarks)."};
  std::string out;
  int64_t vocab = 4096, n_examples = 1024;
  int seq_len = 256, num_labels = 2;
  uint64_t seed = 1;
  app.add_option("--out", out, "output .h5 path")->required();
  app.add_option("--vocab", vocab, "vocabulary size")->check(CLI::Range((int64_t)3, (int64_t)1 << 30));
  app.add_option("--seq-len", seq_len, "tokens per example")->check(CLI::Range(1, 1 << 20));
  app.add_option("--examples", n_examples, "number of examples")->check(CLI::Range((int64_t)1, (int64_t)1 << 32));
  app.add_option("--labels", num_labels, "number of labels")->check(CLI::Range(1, 1 << 16));
  app.add_option("--seed", seed, "PRNG seed");
  CLI11_PARSE(app, argc, argv);
  try {
    llmpi::ClassificationExamples ex;
    ex.seq_len = seq_len;
    const size_t cells = static_cast<size_t>(n_examples) * seq_len;
    ex.input_ids.reserve(cells);
    ex.token_type_ids.reserve(cells);
    ex.attention_mask.assign(cells, 1);
    llmpi::Rng rng(seed);
    for (int64_t i = 0; i < n_examples; i++) {
      for (int t = 0; t < seq_len; t++) {
        ex.input_ids.push_back(t == 0 ? 1 : 2 + static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab - 2))));
        ex.token_type_ids.push_back(t < seq_len / 2 ? 0 : 1);
      }
      ex.labels.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(num_labels))));
    }
    llmpi::ClassificationAttrs a;
    a.vocab_size = vocab;
    a.num_labels = num_labels;
    for (int k = 0; k < num_labels; k++) a.label_names.push_back("label" + std::to_string(k));
    a.pad_id = 0;
    a.tokenizer = "random";
    a.created_by = "bench-random_examples";
    llmpi::write_classification_file(out, ex, a);
    std::printf("wrote %s: %lld random examples of %d tokens, vocab %lld, %d labels\n", out.c_str(),
                (long long)n_examples, seq_len, (long long)vocab, num_labels);
  } catch (const llmpi::Error& e) {
    std::fprintf(stderr, "bench-random_examples: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
