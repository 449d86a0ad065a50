// The op interface between the model and a compute backend.
//
// The model (src/model/) calls only these functions, through a table of function pointers, so a
// backend is one table: cpu_ops() (src/backend/cpu/: OpenBLAS + OpenMP) or cuda_ops()
// (kernels/: cuBLAS + CUDA kernels). The ops themselves, with their contracts, are listed once in
// backend/op_list.h; this header turns that list into the table's members.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/op_list.h"

namespace llmpi {

// What a backend is: where its memory lives and who runs its ops.
enum class Device { cpu, cuda };
inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

struct Ops {
  Device device;
#define LLMPI_OP_MEMBER(ret, name, params) ret(*name) params;
  LLMPI_OPS(LLMPI_OP_MEMBER)
#undef LLMPI_OP_MEMBER
  bool on_gpu() const { return device == Device::cuda; }
};

// The CPU backend (src/backend/cpu/): OpenBLAS or oneDNN for the GEMMs (runtime.cpu_fp32_gemm,
// runtime.cpu_bf16_gemm), OpenMP for the loops.
const Ops& cpu_ops();

}  // namespace llmpi
