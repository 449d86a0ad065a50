// The configuration's choices that are words, each an enum with its words written once. The
// configuration (runtime/config.h) turns the words into these enums where it reads them; from
// then on the program passes enums, and every message that lists the valid words takes them
// from here. The rules that combine choices (which sync method takes which gradient type, which
// precision needs a GPU) are written once, here, beside the choices they relate, and applied
// wherever the choices are made: the configuration when it reads them, a component when it is
// built from them without a configuration (tests, benchmarks).
#pragma once
#include <string>

namespace llmpi {

enum class Family { gpt2, llama, bert };                    // model.family
enum class DeviceChoice { automatic, cpu, cuda };           // runtime.device
enum class GemmPrecision { fp32, tf32, bf16 };              // runtime.precision (backend/gemm_precision.h)
enum class AttentionChoice { automatic, full, fused };      // runtime.attention (model/model_desc.h)
enum class CpuBf16Gemm { automatic, onednn, emulate };     // runtime.cpu_bf16_gemm (backend/gemm_precision.h)
enum class CpuFp32Gemm { automatic, onednn, openblas };    // runtime.cpu_fp32_gemm (backend/gemm_precision.h)
enum class LrSchedule { cosine, linear, constant };         // train.lr_schedule (optim/optimizer.h)
enum class LrScaling { none, linear, sqrt };                // train.lr_scaling (runtime/config.h resolve_batch)
enum class OptimizerKind { adamw, sgd };                    // train.optimizer
enum class OnNonfinite { abort, skip };                     // train.on_nonfinite
enum class SyncMethod { gather_scatter, allreduce, weights, nccl };  // parallel.sync (comm/grad_sync.h)
enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1 };  // parallel.schedule (pipeline/schedule.h)
enum class GradDtype { fp32, bf16 };                        // parallel.grad_dtype: the gradient on the wire
enum class ZeroReduce { micro_batch, step };                // parallel.zero_reduce (comm/grad_sync.h)
enum class Recompute { none, selective, full };             // runtime.recompute (model/transformer.h)

// option_name(e): the word for e ("1f1b" for ScheduleKind::one_f_one_b).
template <typename E>
const char* option_name(E e);
// parse_option(word, &e): true and e for a valid word; false (e untouched) for any other.
template <typename E>
bool parse_option(const std::string& word, E* out);
// The valid words for messages: "\"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\"".
template <typename E>
std::string option_words();

// ---- rules that combine choices ----------------------------------------------------------------

// tf32 is a CUDA tensor-core mode: "" when `precision` can run on the device, else the error.
// `device` is the configured choice; `on_gpu` whether the run resolved to a GPU (the same as the
// choice unless it is automatic). The message names the fix.
std::string precision_device_error(GemmPrecision precision, DeviceChoice device, bool on_gpu);

// The combinations of parallel.sync with parallel.zero, parallel.grad_dtype and parallel.overlap
// that are not implemented or make no sense: "" when fine, else the error naming the key and the fix.
// (What depends on the device — nccl needs a GPU, overlap with an MPI method on a GPU — is refused
// where the device is known: comm/grad_sync.h.)
std::string sync_choice_error(SyncMethod method, bool zero, GradDtype grad_dtype, bool overlap);

// Activation recomputation with a pipeline schedule: zb-h1's input-only backward defers the dense
// layers' weight gradients, whose inputs a recomputing model does not keep. "" when fine, else the
// error naming the keys and the fix.
std::string recompute_schedule_error(Recompute recompute, ScheduleKind schedule, int pp_stages);

}  // namespace llmpi
