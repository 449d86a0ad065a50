// bench-attention_cpu: full vs fused attention (runtime.attention) in a whole GPT-2 training
// step on the CPU backend: the activations' memory and the time of forward + backward.
//
//   build/bench-attention_cpu [--batch B] [--seq-len T]... [--steps S] [--layers L] [--heads H]
//                             [--d-model C] [--vocab V]
//
// Defaults: the gpt2 reference shape of bench/reference.json (4 layers, 4 heads, d_model 256,
// vocab 4096), batch 4, seq_len 256 and 512 (--seq-len may be repeated), 5 timed steps after one
// warm-up. Per seq_len, the two models run alternately (full, fused, full, fused, ...) so that
// a shared machine's load falls on both alike; the table gives per implementation the bytes of
// one micro-batch's activations (Activations::bytes), the backward scratch
// (backward_scratch_bytes), the median ms of a step (zero grads, forward, backward) and the
// fused/full ratios, and the loss of the last step of each (the same to rounding).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "cpu_step_timing.h"
#include "model/memory_estimate.h"

namespace {

const char* kProg = "bench-attention_cpu";

struct Options {
  int batch = 4, steps = 5, layers = 4, heads = 4, d_model = 256, vocab = 4096;
  std::vector<int> seq_lens;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--batch B] [--seq-len T]... [--steps S] [--layers L] [--heads H] "
                  "[--d-model C] [--vocab V]\n", kProg);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", kProg, a.c_str());
      return false;
    }
    char* end = nullptr;
    const long x = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || x < 1 || x > (1L << 20)) {
      std::fprintf(stderr, "%s: %s wants a positive integer, got '%s'\n", kProg, a.c_str(), argv[i]);
      return false;
    }
    const int xi = static_cast<int>(x);
    if (a == "--batch") o.batch = xi;
    else if (a == "--seq-len") o.seq_lens.push_back(xi);
    else if (a == "--steps") o.steps = xi;
    else if (a == "--layers") o.layers = xi;
    else if (a == "--heads") o.heads = xi;
    else if (a == "--d-model") o.d_model = xi;
    else if (a == "--vocab") o.vocab = xi;
    else {
      std::fprintf(stderr, "%s: unknown option %s\n", kProg, a.c_str());
      return false;
    }
  }
  if (o.seq_lens.empty()) o.seq_lens = {256, 512};
  if (o.d_model % o.heads != 0) {
    std::fprintf(stderr, "%s: d_model must be a multiple of heads\n", kProg);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace llmpi;
  Options o;
  if (!parse(argc, argv, o)) return 1;
  try {
    std::printf("gpt2: %d layers, %d heads, d_model %d, vocab %d; batch %d; %d timed steps after 1 warm-up\n",
                o.layers, o.heads, o.d_model, o.vocab, o.batch, o.steps);
    std::printf("%5s %-6s %14s %14s %10s %12s\n", "T", "attn", "activations MB", "bwd scratch MB", "ms/step",
                "last loss");
    for (const int T : o.seq_lens) {
      ModelConfig mc = parse_config("{}", "bench", {"data.train=-"}).model;
      mc.n_layer = o.layers;
      mc.n_head = o.heads;
      mc.d_model = o.d_model;
      mc.seq_len = T;
      ModelDesc desc[2] = {model_desc_from_config(mc, o.vocab), model_desc_from_config(mc, o.vocab)};
      desc[1].attention = AttentionImpl::fused;
      const int B = o.batch;
      const bench::RandomLmBatch data(B, T, o.vocab);
      std::vector<std::unique_ptr<Model>> models;
      std::vector<std::unique_ptr<Activations>> acts;
      for (int k = 0; k < 2; k++) {
        models.push_back(std::make_unique<Model>(desc[k], cpu_ops()));
        models[k]->init_params(1);
        acts.push_back(std::make_unique<Activations>(*models[k], B, T));
      }
      const bench::StepTimes times = bench::time_steps_alternately(models, acts, data.batch, o.steps);
      double act[2], scr[2], med[2];
      for (int k = 0; k < 2; k++) {
        act[k] = acts[k]->bytes() / 1e6;
        scr[k] = backward_scratch_bytes(desc[k], B, T) / 1e6;
        med[k] = bench::median(times.ms[k]);
        std::printf("%5d %-6s %14.1f %14.1f %10.1f %12.6f\n", T, attention_impl_name(desc[k].attention), act[k],
                    scr[k], med[k], times.last_loss[k]);
      }
      std::printf("%5d %-6s %13.3fx %13.3fx %9.3fx\n", T, "ratio", act[1] / act[0], scr[1] / scr[0],
                  med[1] / med[0]);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", kProg, e.what());
    return 1;
  }
  return 0;
}
