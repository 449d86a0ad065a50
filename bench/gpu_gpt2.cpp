// bench-gpu_gpt2: GPT-2 124M training throughput on one GPU with the CUDA backend (fp32; the dense
// layers' GEMMs in --precision).
//
//   build/bench-gpu_gpt2 [--batch B] [--seq-len T] [--steps S] [--warmup W] [--json OUT]
//                        [--layers L] [--heads H] [--d-model C] [--vocab V] [--device D]
//                        [--gemm N] [--precision fp32|tf32|bf16] [--attention auto|full|fused]
//                        [--lm-head-chunk-rows R] [--no-rates]
//                        [--family gpt2|llama] [--kv-heads K] [--ffn F]
//
// --no-rates skips the GEMM-rate measurements (the --gemm cube and the LM head's GEMM of one chunk,
// 39 cuBLAS calls): for a profiler, whose kernel table should hold the training steps only; the
// figures that need them (gemm_tflops, mfu_vs_measured_gemm, lm_head_gemm) are then null.
// --family llama measures a LLaMA-shaped model instead (RMSNorm, RoPE, SwiGLU, untied LM head;
// --kv-heads K grouped K/V heads, default the query heads); --ffn F sets the MLP width (default the
// family's). The shape is checked as llmpi-train checks its configuration, before the card is
// touched. E.g. a 1B-class shape, --family llama --layers 16 --d-model 2048 --heads 32
// --kv-heads 8 --ffn 8192 --vocab 32000. FLOPs per token are the same formula (N counts its
// parameters).
// Defaults: GPT-2 124M (12 layers, 12 heads, d_model 768, vocab 50257, seq_len 1024), batch 8
// per GPU, 3 warm-up + 20 timed steps, fp32 GEMMs, attention as runtime.attention "auto" runs it
// on a GPU (fused: kernels/flash_attention.cu, or with --precision bf16 / tf32 the tensor-core
// kernels of kernels/flash_attention_mma.cu; full stores the B x NH x T x T probabilities per
// layer). The report names the attention kernel that ran ("attention_kernel": cudnn-sdpa-bf16,
// flash-bf16-mma, flash-bf16-wmma, flash-tf32-mma, flash-fp32 or full-cublas-fp32). A step is what the trainer does on one rank: zero grads,
// forward (fused softmax + cross-entropy; the LM head's backward inside it: transformer.h "Fused
// LM head", so forward ms holds it), backward, global-norm clip at 1.0 and AdamW on every
// parameter (weight decay on the 2-D tensors only) — the trainer's one-rank step: the clip factor
// and the non-finite skip computed by the multi-tensor AdamW itself from the gradient's sum of
// squares in device memory (Optimizer::step_on_device), then the loss read back once.
//
// Reports (table on stdout, the same numbers as JSON with --json):
//   tokens/s and ms per step (median over the timed steps, each ended by a device
//   synchronisation; forward / backward from stream marks (cuda_mark), optimizer the rest: the
//   norm, the readback and AdamW),
//   achieved FLOP/s = tokens/s × training FLOPs per token (6 N + 12 L T C: flops_per_token),
//   MFU three ways: against the card's published dense bf16 peak (H100 SXM 989 TFLOP/s: the
//   figure llm.c and the issue quote, whatever --precision is), against the published dense peak
//   of the run's own precision (fp32 67, tf32 494.7, bf16 989 on an H100 SXM), and against the
//   measured rate of a large cuBLAS GEMM of the run's precision (an --gemm cube) on the same card
//   in the same run,
//   GPU memory: the peak of (used now − used before the model) sampled after every forward,
//   backward and optimizer phase (cudaMemGetInfo), against the analytic plan: params + grads +
//   2 AdamW moments (4 × 4 bytes × N; bf16: + the Model's bf16 weight copy, 2 × N) + the model's
//   activation buffer + the backend's scratch workspace,
//   the LM head's logits GEMM of one chunk, its output in rows of V floats and in the padded rows
//   the model uses (lm_logits_row_stride: 50304 for V = 50257), measured before the model,
//   bf16: the weight values rounded to bf16 per timed step (bf16_weight_rounding_count; the
//   Model's weight copy rounds each dense weight once per forward: about N for GPT-2, whose
//   dense weights and tied wte are nearly all its parameters).
// The dense layers use cuBLASLt epilogues (bias, GELU, GELU gradient, bias gradient) unless
// LLMPI_CUDA_EPILOGUES=0 is set: run twice to compare (the JSON records "gemm_epilogues"). The
// unverified kernel paths (backend/cuda_ops.h "Paths") are printed and recorded ("cuda_paths",
// "cuda_paths_off"); LLMPI_CUDA_OFF=all runs the versions a card verified.
// Exit status: 0 measured; 2 when built without CUDA or no usable GPU (the reason is printed).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda_ops.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace {

const char* kProg = "bench-gpu_gpt2";

struct Options {
  int batch = 8, seq_len = 1024, steps = 20, warmup = 3;
  int layers = 12, heads = 12, d_model = 768, vocab = 50257;
  int device = 0, gemm = 8192;
  int head_chunk_rows = 0;  // runtime.lm_head_chunk_rows (0: the default budget)
  std::string family = "gpt2";
  int kv_heads = 0, ffn = 0;  // model.n_kv_head (llama), model.ffn_dim (0: the defaults)
  llmpi::ModelConfig model;   // the above as the trainer's configuration reads them (parse)
  bool rates = true;        // measure the GEMM rates (--no-rates: not)
  std::string json;
  llmpi::GemmPrecision precision = llmpi::GemmPrecision::fp32;  // the dense layers' GEMMs (runtime.precision)
  std::string attention = "auto";
};

void usage() {
  std::printf(
      "usage: %s [--batch B] [--seq-len T] [--steps S] [--warmup W] [--json OUT]\n"
      "          [--layers L] [--heads H] [--d-model C] [--vocab V] [--device D] [--gemm N]\n"
      "          [--precision fp32|tf32|bf16] [--attention auto|full|fused] [--lm-head-chunk-rows R]\n"
      "          [--no-rates] [--family gpt2|llama] [--kv-heads K] [--ffn F]\n",
      kProg);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    }
    if (a == "--no-rates") {
      o.rates = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", kProg, a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "--json") {
      o.json = v;
      continue;
    }
    if (a == "--family") {
      o.family = v;
      if (o.family != "gpt2" && o.family != "llama") {
        std::fprintf(stderr, "%s: --family wants gpt2 or llama (a language model), got '%s'\n", kProg, v);
        return false;
      }
      continue;
    }
    if (a == "--attention") {
      o.attention = v;
      continue;
    }
    if (a == "--precision") {
      if (!llmpi::parse_gemm_precision(v, &o.precision)) {
        std::fprintf(stderr, "%s: --precision wants fp32, tf32 or bf16, got '%s'\n", kProg, v);
        return false;
      }
      continue;
    }
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > (1L << 30)) {
      std::fprintf(stderr, "%s: %s wants a non-negative integer, got '%s'\n", kProg, a.c_str(), v);
      return false;
    }
    const int xi = static_cast<int>(x);
    if (a == "--batch") o.batch = xi;
    else if (a == "--seq-len") o.seq_len = xi;
    else if (a == "--steps") o.steps = xi;
    else if (a == "--warmup") o.warmup = xi;
    else if (a == "--layers") o.layers = xi;
    else if (a == "--heads") o.heads = xi;
    else if (a == "--d-model") o.d_model = xi;
    else if (a == "--vocab") o.vocab = xi;
    else if (a == "--device") o.device = xi;
    else if (a == "--gemm") o.gemm = xi;
    else if (a == "--lm-head-chunk-rows") o.head_chunk_rows = xi;
    else if (a == "--kv-heads") o.kv_heads = xi;
    else if (a == "--ffn") o.ffn = xi;
    else {
      std::fprintf(stderr, "%s: unknown option %s\n", kProg, a.c_str());
      usage();
      return false;
    }
  }
  if (o.batch < 1 || o.seq_len < 1 || o.steps < 1 || o.layers < 1 || o.heads < 1 ||
      o.d_model < 1 || o.d_model % o.heads != 0 || o.vocab < 2 || o.gemm < 64) {
    std::fprintf(stderr, "%s: sizes must be positive, d_model a multiple of heads, --gemm >= 64\n",
                 kProg);
    return false;
  }
  // The trainer's configuration of the model (the family's defaults and its checks), with the
  // shape given.
  std::vector<std::string> sets = {"data.train=-", "model.family=" + o.family,
                                   "model.n_layer=" + std::to_string(o.layers),
                                   "model.n_head=" + std::to_string(o.heads),
                                   "model.d_model=" + std::to_string(o.d_model),
                                   "model.seq_len=" + std::to_string(o.seq_len)};
  if (o.kv_heads) sets.push_back("model.n_kv_head=" + std::to_string(o.kv_heads));
  if (o.ffn) sets.push_back("model.ffn_dim=" + std::to_string(o.ffn));
  try {
    o.model = llmpi::parse_config("{}", "bench", sets).model;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProg, e.what());
    return false;
  }
  return true;
}

// Published dense (no sparsity) peaks, TFLOP/s, from NVIDIA's data sheets, matched against the
// name cudaGetDeviceProperties gives (first match wins, so the specific names come first).
struct CardPeak {
  const char* name_part;
  const char* card;
  double fp32, tf32, bf16;
};
const CardPeak kCardPeaks[] = {
    {"H100 PCIe", "H100 PCIe", 51.2, 378.0, 756.0},
    {"H100 NVL", "H100 NVL", 60.0, 417.5, 835.5},
    {"GH200", "GH200", 67.0, 494.7, 989.4},
    {"H200", "H200 SXM", 67.0, 494.7, 989.4},
    {"H100", "H100 SXM5", 67.0, 494.7, 989.4},
    {"A100", "A100 SXM4", 19.5, 156.0, 312.0},
};

#ifdef LLMPI_HAVE_CUDA
const CardPeak* card_peak(const std::string& device_name) {
  for (const CardPeak& c : kCardPeaks)
    if (device_name.find(c.name_part) != std::string::npos) return &c;
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int run(const Options& o) {
  std::string why;
  if (!llmpi::cuda_available(&why)) {
    std::printf("%s: no usable GPU: %s\n", kProg, why.c_str());
    return 2;
  }
  try {
    using namespace llmpi;
    cuda_bind_device(o.device);
    size_t free0 = 0, total = 0;
    cuda_mem_info(&free0, &total);
    const std::string dev = cuda_device_name();
    std::printf("%s on %s, %.1f GiB\n", kProg, dev.c_str(), total / 1073741824.0);

    // The card's GEMM ceiling in the run's precision, measured; and its published peaks.
    const std::string prec = gemm_precision_name(o.precision);
    const double kNotMeasured = std::numeric_limits<double>::quiet_NaN();  // null in the JSON
    const double gemm_tflops = o.rates ? cuda_gemm_tflops(o.gemm, o.gemm, o.gemm, 10, prec) : kNotMeasured;
    std::printf("cuBLAS GEMM %d^3 (%s operands, fp32 accumulation): %.1f TFLOP/s\n", o.gemm,
                prec.c_str(), gemm_tflops);
    const CardPeak* peak = card_peak(dev);
    const double peak_bf16 = peak ? peak->bf16 : 0.0;
    const double peak_own = !peak                     ? 0.0
                            : prec == "fp32" ? peak->fp32
                            : prec == "tf32" ? peak->tf32
                                                    : peak->bf16;
    if (peak)
      std::printf("published dense peaks of the %s: fp32 %.1f, tf32 %.1f, bf16 %.1f TFLOP/s\n",
                  peak->card, peak->fp32, peak->tf32, peak->bf16);
    else
      std::printf("no published peak known for '%s': MFU is reported against the measured GEMM only\n",
                  dev.c_str());

    ModelDesc desc = model_desc_from_config(o.model, o.vocab);
    desc.attention = resolve_attention(o.attention, true, desc.head_dim());
    desc.lm_head_chunk_rows = o.head_chunk_rows;
    const std::string attn_kernel = desc.attention == AttentionImpl::fused
                                        ? cuda_flash_attention_kernel(o.precision, desc.head_dim())
                                        : "full-cublas-fp32";
    const int B = o.batch, T = o.seq_len, N = B * T;
    // The LM head's logits GEMM of one chunk [R x V x C] with its output in rows of V floats and in
    // the padded rows the chunk buffer has (model_desc.h lm_logits_row_stride): what the padding
    // buys on this card (measured before the model takes its memory).
    const int head_rows = lm_head_chunk_rows(desc, N), head_ld = lm_logits_row_stride(o.vocab);
    const double head_tflops_v =
        o.rates ? cuda_gemm_tflops(head_rows, o.vocab, o.d_model, 10, prec, o.vocab) : kNotMeasured;
    const double head_tflops_padded =
        o.rates ? cuda_gemm_tflops(head_rows, o.vocab, o.d_model, 10, prec, head_ld) : kNotMeasured;
    std::printf("LM-head GEMM %d x %d x %d (%s): output rows of %d floats %.1f TFLOP/s, of %d floats %.1f TFLOP/s\n",
                head_rows, o.vocab, o.d_model, prec.c_str(), o.vocab, head_tflops_v, head_ld, head_tflops_padded);
    const Ops& ops = cuda_ops();
    Model model(desc, ops, ModelPart::whole(), o.precision);
    std::printf("dense GEMMs: %s, cuBLASLt epilogues %s (LLMPI_CUDA_EPILOGUES=0 turns them off)\n",
                gemm_precision_name(o.precision), cuda_gemm_epilogues_enabled() ? "on" : "off");
    std::printf("%s\n", cuda_paths_description().c_str());
    model.init_params(1234);
    Activations acts(model, B, T);
    const size_t n = model.table.numel;
    Optimizer opt(ops, n, OptimizerKind::adamw);  // the trainer's multi-tensor AdamW, the clip computed on the device
    TrainConfig tc;
    tc.beta1 = 0.9, tc.beta2 = 0.95, tc.eps = 1e-8, tc.weight_decay = 0.1, tc.grad_clip = 1.0;

    // Random tokens (a fixed batch: data loading is not what this measures).
    std::vector<int32_t> in(N), tg(N);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      in[i] = static_cast<int32_t>(x % static_cast<uint64_t>(o.vocab));
      tg[i] = static_cast<int32_t>((x >> 32) % static_cast<uint64_t>(o.vocab));
    }

    std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms;
    float loss = 0.0f;
    size_t peak_used = 0;  // the most memory in use (above free0) seen after any phase
    auto sample_memory = [&] {
      size_t f = 0, t = 0;
      cuda_mem_info(&f, &t);
      if (free0 > f) peak_used = std::max(peak_used, free0 - f);
    };
    uint64_t rounded0 = 0;  // bf16 weight values rounded before the timed steps
    for (int s = 1; s <= o.warmup + o.steps; s++) {
      if (s == o.warmup + 1) rounded0 = ops.bf16_weight_rounding_count();
      // The trainer's one-rank step (train/trainer.cpp): no host wait before the one readback at
      // the end (after the optimizer); the phases timed by stream marks.
      const double t0 = now_ms();
      cuda_mark(0);
      model.zero_grads();
      Batch batch;
      batch.B = B;
      batch.T = T;
      batch.tokens = in.data();
      batch.targets = tg.data();
      model.forward_queued(acts, batch, HeadMode::fused);  // the LM head fused, as the trainer does
      cuda_mark(1);
      sample_memory();
      model.backward(acts);
      cuda_mark(2);
      sample_memory();
      ops.zero(&acts.scalars->grad_sumsq, sizeof(double));
      ops.sum_squares_add(&acts.scalars->grad_sumsq, model.grads, n);
      opt.step_on_device(model.params, model.grads, model.table, 6e-4, tc, acts.scalars);
      const StepScalars sc = model.read_scalars(acts);  // loss, gradient norm: the one readback
      loss = model.loss_of(sc, acts);
      if (!update_allowed(sc)) opt.unstep();  // the device skipped the update (as the trainer)
      cuda_synchronize();
      const double t3 = now_ms();
      sample_memory();
      if (s > o.warmup) {
        const double f = cuda_marks_ms(0, 1), b = cuda_marks_ms(1, 2);
        step_ms.push_back(t3 - t0);
        fwd_ms.push_back(f);
        bwd_ms.push_back(b);
        opt_ms.push_back(t3 - t0 - f - b);
      }
    }

    // bf16: weight values rounded per step (the Model's weight copy: each dense weight once)
    const double rounded_per_step =
        o.steps > 0 ? static_cast<double>(ops.bf16_weight_rounding_count() - rounded0) / o.steps : 0.0;
    const double ms = median(step_ms);
    const double tok_s = N / (ms * 1e-3);
    const double flops_tok = flops_per_token(desc, n, T);
    const double achieved_tflops = tok_s * flops_tok / 1e12;
    const double mfu = achieved_tflops / gemm_tflops;
    const double mfu_bf16_peak = peak ? achieved_tflops / peak_bf16 : 0.0;
    const double mfu_own_peak = peak ? achieved_tflops / peak_own : 0.0;
    const double used_gib = peak_used / 1073741824.0;
    // params, grads, m, v; bf16: the Model's bf16 weight copy too
    std::vector<size_t> copy_offsets;
    const double state_b = 4.0 * n * sizeof(float) + (o.precision == GemmPrecision::bf16
                                                          ? 2.0 * aligned_copy_layout(model.table, &copy_offsets)
                                                          : 0.0);
    const double act_b = static_cast<double>(acts.bytes());
    const double ws_b = static_cast<double>(cuda_workspace_bytes());
    const double plan_gib = (state_b + act_b + ws_b) / 1073741824.0;

    std::printf("\nmodel: %s, %d layers, %d heads (%d K/V), d_model %d, ffn %d, vocab %d, seq_len %d; %.2fM params\n",
                o.family.c_str(), o.layers, o.heads, desc.n_kv_head, o.d_model, desc.ffn_dim, o.vocab, T, n / 1e6);
    std::printf("batch %d x %d = %d tokens/step, %d timed steps after %d warm-up, last loss %.4f, %s attention (%s)\n\n",
                B, T, N, o.steps, o.warmup, loss, attention_impl_name(desc.attention), attn_kernel.c_str());
    std::printf("%-34s %12s\n", "metric", "value");
    std::printf("%-34s %12.0f\n", "tokens/s", tok_s);
    std::printf("%-34s %12.2f\n", "ms/step (median)", ms);
    std::printf("%-34s %12.2f\n", "  forward ms", median(fwd_ms));
    std::printf("%-34s %12.2f\n", "  backward ms", median(bwd_ms));
    std::printf("%-34s %12.2f\n", "  clip + AdamW ms", median(opt_ms));
    std::printf("%-34s %12.3e\n", "training FLOPs/token", flops_tok);
    std::printf("%-34s %12.2f\n", "achieved TFLOP/s", achieved_tflops);
    std::printf("%-34s %12s\n", "precision (dense GEMMs)", prec.c_str());
    if (o.precision == GemmPrecision::bf16)
      std::printf("%-34s %12.0f\n", "bf16 weight values rounded/step", rounded_per_step);
    if (peak) {
      std::printf("%-34s %11.1f%%\n", "MFU vs published bf16 peak", 100.0 * mfu_bf16_peak);
      std::printf("%-34s %11.1f%%\n", ("MFU vs published " + prec + " peak").c_str(),
                  100.0 * mfu_own_peak);
    }
    std::printf("%-34s %12.2f\n", "GEMM TFLOP/s (measured)", gemm_tflops);
    std::printf("%-34s %11.1f%%\n", "MFU vs measured GEMM", 100.0 * mfu);
    std::printf("%-34s %12.2f\n", "peak GPU memory of the run, GiB", used_gib);
    std::printf("%-34s %12.2f\n", "analytic plan, GiB", plan_gib);
    std::printf("%-34s %12.2f\n", o.precision == GemmPrecision::bf16 ? "  params+grads+m+v+bf16 copy, GiB"
                                                                      : "  params+grads+m+v, GiB",
                state_b / 1073741824.0);
    std::printf("%-34s %12.2f\n", "  activations+tokens, GiB", act_b / 1073741824.0);
    std::printf("%-34s %12.2f\n", "  backend workspace, GiB", ws_b / 1073741824.0);

    if (!o.json.empty()) {
      // the unverified paths (backend/cuda_ops.h "Paths"): which ran, which were off and why
      nlohmann::json paths_json = nlohmann::json::array();
      std::string paths_off;
      for (const CudaPath& p : cuda_paths()) {
        paths_json.push_back({{"name", p.name}, {"on", p.on}, {"why_off", p.why_off}});
        if (!p.on) paths_off += (paths_off.empty() ? "" : ",") + p.name;
      }
      nlohmann::json j = {
          {"benchmark", "gpu_gpt2"},
          {"device", dev},
          {"precision", gemm_precision_name(o.precision)},
          {"gemm_epilogues", cuda_gemm_epilogues_enabled()},
          {"cuda_paths_off", paths_off},
          {"cuda_paths", paths_json},
          {"card", peak ? peak->card : ""},
          {"published_peak_tflops",
           {{"fp32", peak ? peak->fp32 : 0.0}, {"tf32", peak ? peak->tf32 : 0.0},
            {"bf16", peak ? peak->bf16 : 0.0}}},
          {"mfu_vs_published_bf16_peak", mfu_bf16_peak},
          {"mfu_vs_published_own_peak", mfu_own_peak},
                    {"attention", attention_impl_name(desc.attention)},
          {"attention_kernel", attn_kernel},
          {"model",
           {{"family", o.family}, {"n_layer", o.layers}, {"n_head", o.heads}, {"n_kv_head", desc.n_kv_head},
            {"d_model", o.d_model}, {"ffn_dim", desc.ffn_dim}, {"vocab_size", o.vocab}, {"seq_len", T},
            {"params", n}}},
          {"batch", B},
          {"tokens_per_step", N},
          {"steps", o.steps},
          {"warmup", o.warmup},
          {"last_loss", loss},
          {"tokens_per_s", tok_s},
          {"ms_per_step", ms},
          {"forward_ms", median(fwd_ms)},
          {"backward_ms", median(bwd_ms)},
          {"optim_ms", median(opt_ms)},
          {"step_ms_all", step_ms},
          {"flops_per_token", flops_tok},
          {"achieved_tflops", achieved_tflops},
          {"gemm_tflops", gemm_tflops},
          {"gemm_size", o.gemm},
          {"mfu_vs_measured_gemm", mfu},
          {"lm_head_gemm",
           {{"rows", head_rows}, {"vocab_size", o.vocab}, {"d_model", o.d_model}, {"padded_stride", head_ld},
            {"tflops_rows_of_vocab", head_tflops_v}, {"tflops_rows_padded", head_tflops_padded}}},
          {"bf16_weight_values_rounded_per_step", rounded_per_step},
          {"peak_memory_bytes", peak_used},
          {"memory_total_bytes", total},
          {"plan_bytes",
           {{"params_grads_moments", state_b}, {"activations_tokens", act_b},
            {"workspace", ws_b}, {"total", state_b + act_b + ws_b}}},
      };
      std::ofstream f(o.json);
      f << j.dump(2) << "\n";
      if (!f) {
        std::fprintf(stderr, "%s: cannot write %s\n", kProg, o.json.c_str());
        return 1;
      }
      std::printf("\nwrote %s\n", o.json.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProg, e.what());
    return 1;
  }
  return 0;
}
#endif  // LLMPI_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 1;
#ifndef LLMPI_HAVE_CUDA
  std::printf("%s: built without CUDA (make CUDA=0 or no nvcc); nothing to measure\n", kProg);
  return 2;
#else
  return run(o);
#endif
}
