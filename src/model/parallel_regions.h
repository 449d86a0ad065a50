// The tensor- and sequence-parallel hand-offs of a block's branches, named where they stand, so
// that a sublayer reads the same at every tensor-parallel degree: each does nothing at tp = 1.
// The contracts are transformer.h's "Tensor parallelism" and "Sequence parallelism".
//
//   a branch's column-parallel GEMM (QKV, the MLP's first) reads every row of its input:
//     forward   enter_column(rows)          the residual stream's rows as they are, or (SP)
//                                           all-gathered into `gathered`
//     backward  enter_column_backward(..)   each rank's share of that GEMM's input gradient onto
//                                           the rows: summed over the group (TP), or
//                                           reduce-scattered (SP)
//   its row-parallel GEMM (attention's output projection, the MLP's second) leaves each rank's
//   partial sum of every row:
//     forward   leave_row(partial)          summed in place (TP), or reduce-scattered onto this
//                                           rank's rows (SP)
//     backward  leave_row_backward(g)       the rows' gradient as it is, or (SP) all-gathered
//   a whole tensor's gradient made from this rank's rows only (a norm weight's with SP):
//               sum_row_shares(g, n)         summed over the group
#pragma once
#include <cstddef>
#include <functional>

#include "backend/ops.h"
#include "model/model_desc.h"
#include "runtime/group_collectives.h"

namespace llmpi {

struct ParallelRegions {
  const ModelDesc& d;
  const TensorGroup& group;
  size_t row_floats;  // the residual stream's rows x C: N·C, or with sequence parallelism Nr·C
  size_t all_floats;  // every row: N·C

  bool seq() const { return d.seq_shards(); }

  const float* enter_column(const float* rows, float* gathered) const {
    if (!seq()) return rows;
    group.all_gather(rows, gathered, row_floats);
    return gathered;
  }
  float* leave_row(float* partial, float* scattered) const {
    if (seq()) {
      group.reduce_scatter(partial, scattered, row_floats);
      return scattered;
    }
    if (d.tp > 1) group.sum(partial, all_floats);
    return partial;
  }
  const float* leave_row_backward(const float* grad_rows, float* gathered) const {
    return enter_column(grad_rows, gathered);
  }
  // A column-parallel GEMM's input gradient, which `grad(into)` ADDS into an [N, C] buffer, onto
  // the residual stream's rows, returning where it is:
  //   acc null    into the zeroed `part`, then summed there (TP) or reduce-scattered into `rows` (SP)
  //   acc given   added to acc (Nr·C): at tp = 1 by grad(acc) itself (the GEMM accumulates), else
  //               as above, then acc += it
  const float* enter_column_backward(float* part, float* rows, float* acc, const Ops& o,
                                     const std::function<void(float*)>& grad) const {
    if (acc && d.tp == 1) {
      grad(acc);
      return acc;
    }
    o.zero(part, all_floats * sizeof(float));
    grad(part);
    const float* mine = part;
    if (seq()) {
      group.reduce_scatter(part, rows, row_floats);
      mine = rows;
    } else if (d.tp > 1) {
      group.sum(part, all_floats);
    }
    if (!acc) return mine;
    o.residual_forward(acc, acc, mine, row_floats);
    return acc;
  }
  void sum_row_shares(float* g, size_t n) const {
    if (seq()) group.sum(g, n);
  }
};

}  // namespace llmpi
