// The CPU backend's op table (the op list and contracts: backend/op_list.h).
#include "backend/ops.h"

#include "backend/cpu/cpu_ops.h"

namespace llmpi {

const Ops& cpu_ops() {
  static const Ops ops = [] {
    Ops o{};
    o.device = Device::cpu;
#define LLMPI_OP_ASSIGN(ret, name, params) o.name = cpu::name;
    LLMPI_OPS(LLMPI_OP_ASSIGN)
#undef LLMPI_OP_ASSIGN
    return o;
  }();
  return ops;
}

}  // namespace llmpi
