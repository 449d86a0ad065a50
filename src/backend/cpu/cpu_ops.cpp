// The CPU backend's op table (contract: backend/ops.h).
#include "backend/ops.h"

#include "backend/cpu/cpu_ops.h"

namespace llmpi {

const Ops& cpu_ops() {
  static const Ops ops = [] {
    Ops o{};
    o.name = "cpu";
    o.alloc = cpu::alloc;
    o.free = cpu::free;
    o.zero = cpu::zero;
    o.copy_to_device = cpu::copy;
    o.copy_to_host = cpu::copy;
    o.embedding_forward = cpu::embedding_forward;
    o.embedding_backward = cpu::embedding_backward;
    o.layernorm_forward = cpu::layernorm_forward;
    o.layernorm_backward = cpu::layernorm_backward;
    o.matmul_forward = cpu::matmul_forward;
    o.matmul_backward = cpu::matmul_backward;
    o.attention_forward = cpu::attention_forward;
    o.attention_backward = cpu::attention_backward;
    o.gelu_forward = cpu::gelu_forward;
    o.gelu_backward = cpu::gelu_backward;
    o.residual_forward = cpu::residual_forward;
    o.softmax_xent = cpu::softmax_xent;
    o.adamw_update = cpu::adamw_update;
    o.sgd_update = cpu::sgd_update;
    o.sum_squares = cpu::sum_squares;
    o.scale = cpu::scale;
    return o;
  }();
  return ops;
}

}  // namespace llmpi
