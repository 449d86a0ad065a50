// bench-sample_gpt2: generation speed on the CPU (model/generate.h), with the KV cache and
// without it (the full forward over the whole sequence for every new token).
//
//   build/bench-sample_gpt2 [--prompt P] [--new N] [--runs R] [--threads T] [--no-baseline]
//                           [--family gpt2|llama] [--layers L] [--heads H] [--kv-heads K]
//                           [--d-model C] [--vocab V] [--context S] [--json OUT]
//
// Defaults: the GPT-2 124M shape (12 layers, 12 heads, d_model 768, vocab 50257, context 1024)
// with random weights (N(0, 0.02), seed 1234), a prompt of P = 16 random tokens and N = 64 greedy
// new tokens, R = 3 runs, each running both modes in turn. Reported per mode (median over the runs):
//   prefill_s      the prompt's forward up to the first new token's logits
//   decode_tok_s   new tokens per second after the first (each = a feed of one token + argmax)
//   total_tok_s    new tokens per second including the prefill
// and whether both modes chose the same tokens (they should: the same logits up to rounding).
#include <CLI/CLI.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/rng.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_threads(void);

using namespace llmpi;
using Clock = std::chrono::steady_clock;

namespace {

struct RunResult {
  double prefill_s = 0, decode_s = 0;
  std::vector<int32_t> tokens;
};

// Greedy generation of n_new tokens after the prompt, timed.
RunResult run_once(Generator& g, const std::vector<int32_t>& prompt, int n_new) {
  RunResult r;
  std::vector<float> logits(static_cast<size_t>(g.vocab_size()));
  SamplingParams greedy;
  greedy.greedy = true;
  Rng rng(0);
  g.reset();
  const auto t0 = Clock::now();
  g.feed(prompt.data(), static_cast<int>(prompt.size()), logits.data());
  int32_t id = choose_next_token(logits.data(), g.vocab_size(), greedy, rng);
  r.tokens.push_back(id);
  const auto t1 = Clock::now();
  for (int i = 1; i < n_new; i++) {
    g.feed(&id, 1, logits.data());
    id = choose_next_token(logits.data(), g.vocab_size(), greedy, rng);
    r.tokens.push_back(id);
  }
  const auto t2 = Clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.decode_s = std::chrono::duration<double>(t2 - t1).count();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-sample_gpt2: CPU generation speed with and without the KV cache"};
  int prompt_len = 16, n_new = 64, runs = 3, threads = 0, layers = 12, heads = 12, kv_heads = 0, d_model = 768,
      vocab = 50257, context = 1024;
  std::string family = "gpt2", json_out;
  bool no_baseline = false;
  app.add_option("--prompt", prompt_len, "prompt tokens")->capture_default_str();
  app.add_option("--new", n_new, "new tokens per run")->capture_default_str();
  app.add_option("--runs", runs, "runs of each mode (median reported)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0 = OpenMP's default)")->capture_default_str();
  app.add_flag("--no-baseline", no_baseline, "skip the run without a KV cache");
  app.add_option("--family", family, "gpt2 | llama")->capture_default_str();
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "llama: key/value heads (0 = heads)")->capture_default_str();
  app.add_option("--d-model", d_model)->capture_default_str();
  app.add_option("--vocab", vocab)->capture_default_str();
  app.add_option("--context", context, "max_seq_len")->capture_default_str();
  app.add_option("--json", json_out, "write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) {
      omp_set_num_threads(threads);
      openblas_set_num_threads(threads);
    }
    if (prompt_len < 1 || n_new < 1 || runs < 1 || prompt_len + n_new > context)
      fail("need --prompt >= 1, --new >= 1, --runs >= 1 and prompt + new <= --context");
    std::vector<std::string> sets = {"data.train=-", "model.family=" + family};
    if (family == "llama" && kv_heads > 0) sets.push_back("model.n_kv_head=" + std::to_string(kv_heads));
    ModelConfig mc = parse_config("{}", "bench", sets).model;
    mc.n_layer = layers;
    mc.n_head = heads;
    mc.d_model = d_model;
    mc.seq_len = context;
    const ModelDesc desc = model_desc_from_config(mc, vocab);
    Model model(desc, cpu_ops());
    model.init_params(1234);
    Rng rng(99);
    std::vector<int32_t> prompt(prompt_len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng.below(vocab));

    std::printf("bench-sample_gpt2: %s, %d layers, %d heads, d_model %d, vocab %d, context %d: %.1fM parameters; "
                "%d OpenMP / %d OpenBLAS threads\n",
                family.c_str(), layers, heads, d_model, vocab, context, model.table.numel / 1e6, omp_get_max_threads(),
                openblas_get_num_threads());
    std::printf("prompt %d tokens, %d new tokens (greedy), %d runs per mode, medians\n\n", prompt_len, n_new, runs);
    std::printf("%-12s %12s %16s %16s\n", "mode", "prefill_s", "decode_tok/s", "total_tok/s");
    nlohmann::json out = {{"family", family}, {"layers", layers}, {"heads", heads}, {"d_model", d_model},
                          {"vocab", vocab}, {"context", context}, {"params", model.table.numel},
                          {"prompt", prompt_len}, {"new", n_new}, {"runs", runs}, {"threads", omp_get_max_threads()}};
    // The modes alternate within each run, so a change in the machine's load hits both alike.
    std::vector<bool> modes = {true};
    if (!no_baseline) modes.push_back(false);
    std::vector<std::unique_ptr<Generator>> gens;
    for (bool cache : modes) gens.push_back(std::make_unique<Generator>(model, 0, cache));
    std::vector<std::vector<double>> pre(modes.size()), dec(modes.size()), tot(modes.size());
    std::vector<std::vector<int32_t>> tokens(modes.size());
    for (int i = 0; i < runs; i++)
      for (size_t m = 0; m < modes.size(); m++) {
        const RunResult r = run_once(*gens[m], prompt, n_new);
        pre[m].push_back(r.prefill_s);
        dec[m].push_back(n_new > 1 ? (n_new - 1) / r.decode_s : 0.0);
        tot[m].push_back(n_new / (r.prefill_s + r.decode_s));
        tokens[m] = r.tokens;
      }
    for (size_t m = 0; m < modes.size(); m++) {
      const char* name = modes[m] ? "kv_cache" : "no_cache";
      std::printf("%-12s %12.3f %16.2f %16.2f\n", name, median(pre[m]), median(dec[m]), median(tot[m]));
      out[name] = {{"prefill_s", median(pre[m])}, {"decode_tok_s", median(dec[m])}, {"total_tok_s", median(tot[m])},
                   {"prefill_runs", pre[m]}, {"decode_tok_s_runs", dec[m]}};
    }
    std::fflush(stdout);
    if (tokens.size() == 2) {
      const bool same = tokens[0] == tokens[1];
      std::printf("\nspeed-up of decoding with the cache: %.1fx; same tokens in both modes: %s\n",
                  out["kv_cache"]["decode_tok_s"].get<double>() / out["no_cache"]["decode_tok_s"].get<double>(),
                  same ? "yes" : "NO");
      out["same_tokens"] = same;
    }
    if (!json_out.empty()) std::ofstream(json_out) << out.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench-sample_gpt2: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
