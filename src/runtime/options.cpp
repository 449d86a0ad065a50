#include "runtime/options.h"

#include <utility>

namespace llmpi {

namespace {

// The words of each choice, in the order messages list them.
template <typename E>
struct Words;
#define LLMPI_WORDS(E, ...)                                    \
  template <>                                                  \
  struct Words<E> {                                            \
    static constexpr std::pair<E, const char*> list[] = {__VA_ARGS__}; \
  };
LLMPI_WORDS(Family, {Family::gpt2, "gpt2"}, {Family::llama, "llama"}, {Family::bert, "bert"})
LLMPI_WORDS(DeviceChoice, {DeviceChoice::automatic, "auto"}, {DeviceChoice::cpu, "cpu"}, {DeviceChoice::cuda, "cuda"})
LLMPI_WORDS(GemmPrecision, {GemmPrecision::fp32, "fp32"}, {GemmPrecision::tf32, "tf32"}, {GemmPrecision::bf16, "bf16"})
LLMPI_WORDS(AttentionChoice, {AttentionChoice::automatic, "auto"}, {AttentionChoice::full, "full"},
            {AttentionChoice::fused, "fused"})
LLMPI_WORDS(CpuBf16Gemm, {CpuBf16Gemm::automatic, "auto"}, {CpuBf16Gemm::onednn, "onednn"},
            {CpuBf16Gemm::emulate, "emulate"})
LLMPI_WORDS(CpuFp32Gemm, {CpuFp32Gemm::automatic, "auto"}, {CpuFp32Gemm::onednn, "onednn"},
            {CpuFp32Gemm::openblas, "openblas"})
LLMPI_WORDS(LrSchedule, {LrSchedule::cosine, "cosine"}, {LrSchedule::linear, "linear"},
            {LrSchedule::constant, "constant"})
LLMPI_WORDS(LrScaling, {LrScaling::none, "none"}, {LrScaling::linear, "linear"}, {LrScaling::sqrt, "sqrt"})
LLMPI_WORDS(OptimizerKind, {OptimizerKind::adamw, "adamw"}, {OptimizerKind::sgd, "sgd"})
LLMPI_WORDS(OnNonfinite, {OnNonfinite::abort, "abort"}, {OnNonfinite::skip, "skip"})
LLMPI_WORDS(SyncMethod, {SyncMethod::gather_scatter, "gather_scatter"}, {SyncMethod::allreduce, "allreduce"},
            {SyncMethod::weights, "weights"}, {SyncMethod::nccl, "nccl"})
LLMPI_WORDS(ScheduleKind, {ScheduleKind::gpipe, "gpipe"}, {ScheduleKind::one_f_one_b, "1f1b"},
            {ScheduleKind::interleaved, "interleaved"}, {ScheduleKind::zb_h1, "zb-h1"})
LLMPI_WORDS(GradDtype, {GradDtype::fp32, "fp32"}, {GradDtype::bf16, "bf16"})
LLMPI_WORDS(ZeroReduce, {ZeroReduce::micro_batch, "micro_batch"}, {ZeroReduce::step, "step"})
LLMPI_WORDS(Recompute, {Recompute::none, "none"}, {Recompute::selective, "selective"}, {Recompute::full, "full"})
#undef LLMPI_WORDS

}  // namespace

template <typename E>
const char* option_name(E e) {
  for (const auto& [value, word] : Words<E>::list)
    if (value == e) return word;
  return "?";
}

template <typename E>
bool parse_option(const std::string& word, E* out) {
  for (const auto& [value, w] : Words<E>::list)
    if (word == w) {
      *out = value;
      return true;
    }
  return false;
}

template <typename E>
std::string option_words() {
  const auto& list = Words<E>::list;
  const size_t n = sizeof list / sizeof list[0];
  std::string s;
  for (size_t i = 0; i < n; i++) {
    if (i > 0) s += i + 1 == n ? " or " : ", ";
    s += std::string("\"") + list[i].second + "\"";
  }
  return s;
}

#define LLMPI_INSTANTIATE(E)                                  \
  template const char* option_name<E>(E);                     \
  template bool parse_option<E>(const std::string&, E*);      \
  template std::string option_words<E>();
LLMPI_INSTANTIATE(Family)
LLMPI_INSTANTIATE(DeviceChoice)
LLMPI_INSTANTIATE(GemmPrecision)
LLMPI_INSTANTIATE(AttentionChoice)
LLMPI_INSTANTIATE(CpuBf16Gemm)
LLMPI_INSTANTIATE(CpuFp32Gemm)
LLMPI_INSTANTIATE(LrSchedule)
LLMPI_INSTANTIATE(LrScaling)
LLMPI_INSTANTIATE(OptimizerKind)
LLMPI_INSTANTIATE(OnNonfinite)
LLMPI_INSTANTIATE(SyncMethod)
LLMPI_INSTANTIATE(ScheduleKind)
LLMPI_INSTANTIATE(GradDtype)
LLMPI_INSTANTIATE(ZeroReduce)
LLMPI_INSTANTIATE(Recompute)
#undef LLMPI_INSTANTIATE

std::string precision_device_error(GemmPrecision precision, DeviceChoice device, bool on_gpu) {
  if (precision != GemmPrecision::tf32 || on_gpu) return "";
  if (device == DeviceChoice::cpu)
    return "config: 'runtime.precision' \"tf32\" is a CUDA tensor-core mode; use \"fp32\" or \"bf16\" with "
           "runtime.device \"cpu\"";
  return "runtime.precision \"tf32\" is a CUDA tensor-core mode, but this run is on the CPU: use \"fp32\" or "
         "\"bf16\", or runtime.device \"cuda\" on GPUs";
}

std::string sync_choice_error(SyncMethod method, bool zero, GradDtype grad_dtype, bool overlap) {
  const std::string name = option_name(method);
  if (zero && method == SyncMethod::weights)
    return "config: 'parallel.zero' shards the optimizer state of ranks that average gradients; \"weights\" gives "
           "every rank its own optimizer over every parameter: use parallel.sync \"allreduce\" or \"gather_scatter\" "
           "with zero 1 or 2, or zero 0";
  if (grad_dtype == GradDtype::bf16 && method != SyncMethod::allreduce && method != SyncMethod::nccl)
    return "config: 'parallel.grad_dtype' \"bf16\" is implemented for parallel.sync \"allreduce\" (with or without "
           "zero 1) and \"nccl\", not \"" + name + "\": use one of those, or grad_dtype \"fp32\"";
  if (overlap && method == SyncMethod::weights)
    return "config: 'parallel.overlap' applies to gradient averaging; \"weights\" averages parameters after the "
           "step: set it to false";
  return "";
}

std::string recompute_schedule_error(Recompute recompute, ScheduleKind schedule, int pp_stages) {
  if (recompute == Recompute::none || schedule != ScheduleKind::zb_h1 || pp_stages <= 1) return "";
  return std::string("config: 'runtime.recompute' \"") + option_name(recompute) +
         "\" is not implemented with parallel.schedule \"zb-h1\" (its deferred weight gradients read activations "
         "that recomputation does not keep): use schedule \"1f1b\", \"gpipe\" or \"interleaved\", or recompute \"none\"";
}

}  // namespace llmpi
