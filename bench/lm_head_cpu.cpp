// bench-lm_head_cpu: the chunked LM head (model/transformer.h "Chunked LM head") in a whole GPT-2
// training step on the CPU backend: the activations' memory and the time of forward + backward,
// unchunked (one chunk of all N = B·T rows: N x V logits, as before the chunking) against the
// default chunk (as many rows as fit kLmHeadChunkBytes of logits) and chunks of --rows rows, the
// last both recomputing in backward (forward + backward, "rows") and fused (HeadMode::fused, as the
// trainer's single-model step runs it: each chunk's backward inside the forward, "rows fused").
//
//   build/bench-lm_head_cpu [--batch B] [--seq-len T] [--steps S] [--layers L] [--heads H]
//                           [--d-model C] [--vocab V] [--rows R] [--precision fp32|bf16]
//
// Defaults: GPT-2's real vocabulary (V = 50257), 4 layers, 4 heads, d_model 256, batch 8,
// seq_len 256, R = 256, fp32, 5 timed steps after one warm-up. The variants run alternately
// (unchunked, default, R, R fused, unchunked, ...) so that a shared machine's load falls on all alike; the
// table gives per variant the rows per chunk, the bytes of one micro-batch's activations
// (Activations::bytes), the bf16 GEMM operand scratch (gemm_operand_scratch_bytes; 0 in fp32),
// the median ms of a step (zero grads, forward, backward), the ratios to unchunked, and the loss
// of the last step (the same to rounding).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/gemm_precision.h"
#include "model/transformer.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "cpu_step_timing.h"
#include "model/memory_estimate.h"

namespace {

const char* kProg = "bench-lm_head_cpu";

struct Options {
  int batch = 8, seq_len = 256, steps = 5, layers = 4, heads = 4, d_model = 256, vocab = 50257, rows = 256;
  std::string precision = "fp32";
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--batch B] [--seq-len T] [--steps S] [--layers L] [--heads H] [--d-model C] "
                  "[--vocab V] [--rows R] [--precision fp32|bf16]\n", kProg);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", kProg, a.c_str());
      return false;
    }
    if (a == "--precision") {
      o.precision = argv[++i];
      continue;
    }
    char* end = nullptr;
    const long x = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || x < 1 || x > (1L << 20)) {
      std::fprintf(stderr, "%s: %s wants a positive integer, got '%s'\n", kProg, a.c_str(), argv[i]);
      return false;
    }
    const int xi = static_cast<int>(x);
    if (a == "--batch") o.batch = xi;
    else if (a == "--seq-len") o.seq_len = xi;
    else if (a == "--steps") o.steps = xi;
    else if (a == "--layers") o.layers = xi;
    else if (a == "--heads") o.heads = xi;
    else if (a == "--d-model") o.d_model = xi;
    else if (a == "--vocab") o.vocab = xi;
    else if (a == "--rows") o.rows = xi;
    else {
      std::fprintf(stderr, "%s: unknown option %s\n", kProg, a.c_str());
      return false;
    }
  }
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
    GemmPrecision prec;
    if (!parse_gemm_precision(o.precision, &prec) || prec == GemmPrecision::tf32)
      fail("--precision must be fp32 or bf16 on the CPU, got '", o.precision, "'");
    const int B = o.batch, T = o.seq_len, N = B * T;
    std::printf("gpt2: %d layers, %d heads, d_model %d, vocab %d; batch %d, seq_len %d (N = %d rows); GEMMs %s; "
                "%d timed steps after 1 warm-up\n",
                o.layers, o.heads, o.d_model, o.vocab, B, T, N, o.precision.c_str(), o.steps);
    ModelConfig mc = parse_config("{}", "bench", {"data.train=-"}).model;
    mc.n_layer = o.layers;
    mc.n_head = o.heads;
    mc.d_model = o.d_model;
    mc.seq_len = T;
    constexpr int kVariants = 4;
    const char* names[kVariants] = {"unchunked", "default", "rows", "rows fused"};
    const int chunk[kVariants] = {N, 0, std::min(o.rows, N), std::min(o.rows, N)};
    const std::vector<bool> fused = {false, false, false, true};
    const bench::RandomLmBatch data(B, T, o.vocab);
    std::vector<ModelDesc> desc;
    std::vector<std::unique_ptr<Model>> models;
    std::vector<std::unique_ptr<Activations>> acts;
    for (int k = 0; k < kVariants; k++) {
      desc.push_back(model_desc_from_config(mc, o.vocab));
      desc[k].lm_head_chunk_rows = chunk[k];
      models.push_back(std::make_unique<Model>(desc[k], cpu_ops(), ModelPart::whole(), prec));
      models[k]->init_params(1);
      acts.push_back(std::make_unique<Activations>(*models[k], B, T));
    }
    const bench::StepTimes times = bench::time_steps_alternately(models, acts, data.batch, o.steps, fused);
    std::printf("%-11s %8s %15s %14s %10s %12s\n", "head", "rows", "activations MB", "gemm scr MB", "ms/step", "last loss");
    double act[kVariants], scr[kVariants], med[kVariants];
    for (int k = 0; k < kVariants; k++) {
      act[k] = acts[k]->bytes() / 1e6;
      scr[k] = gemm_operand_scratch_bytes(desc[k], B, T, prec, false) / 1e6;
      med[k] = bench::median(times.ms[k]);
      std::printf("%-11s %8d %15.1f %14.1f %10.1f %12.6f\n", names[k], acts[k]->lm_rows, act[k], scr[k], med[k], times.last_loss[k]);
    }
    for (int k = 1; k < kVariants; k++)
      std::printf("%-11s %8s %14.3fx %13.3fx %9.3fx\n", names[k], "/unch.", act[k] / act[0],
                  scr[0] > 0 ? scr[k] / scr[0] : 0.0, med[k] / med[0]);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", kProg, e.what());
    return 1;
  }
  return 0;
}
