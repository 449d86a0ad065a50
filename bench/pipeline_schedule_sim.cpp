// bench-pipeline_schedule_sim: the pipeline schedules under a per-stage compute model (no MPI, no
// timing: every stage computes F, B, BI and W in the given unit costs and messages are instant),
// the reference the measured traces are compared against (docs/PIPELINE.md).
//
//   build/bench-pipeline_schedule_sim [--f 1] [--b 2] [--bi 1]
//
// For S in {2, 4, 8} and M in {S, 2S, 4S, 8S}: each schedule's simulated bubble fraction next to
// its formula — GPipe and 1F1B (S-1)/(M+S-1), interleaved with v = 2 chunks (S-1)/(v·M+S-1),
// zb-h1 (S-1)/(3M+S-1) when F = B_input = W — and the peak number of micro-batches whose
// activations stage 0 holds (GPipe M, 1F1B S, interleaved (S-1)·2+(v-1)·S+1 chunk-micro-batches of
// half the layers, zb-h1 S).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "pipeline/schedule.h"

using namespace llmpi;

int main(int argc, char** argv) {
  double f = 1, b = 2, bi = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--f")) f = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--b")) b = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bi")) bi = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--f F] [--b B] [--bi B_INPUT]\n", argv[0]);
      return 2;
    }
  }
  std::printf("costs: F %.2f, B %.2f (B_input %.2f + W %.2f)\n", f, b, bi, b - bi);
  std::printf("%3s %4s  %-12s %9s %9s %14s\n", "S", "M", "schedule", "bubble", "formula", "peak acts st.0");
  const ScheduleKind kinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                ScheduleKind::zb_h1};
  for (int S : {2, 4, 8}) {
    for (int M : {S, 2 * S, 4 * S, 8 * S}) {
      for (ScheduleKind k : kinds) {
        const int v = k == ScheduleKind::interleaved ? 2 : 1;
        // Interleaved chunks hold 1/v of a stage's layers: each costs 1/v.
        const SimResult r = simulate_schedule(k, S, M, v, f / v, b / v, bi / v);
        double formula = (double)(S - 1) / (v * M + S - 1);
        if (k == ScheduleKind::zb_h1) {  // idle (S-1)·(F + B_input - W) per stage
          const double idle = (S - 1) * (f + bi - (b - bi));
          formula = idle / (M * (f + b) + idle);
        }
        const ActivationPeak p = activation_peak(build_schedule(k, S, M, 0, v), v);
        std::printf("%3d %4d  %-12s %9.4f %9.4f %10d%s\n", S, M, schedule_kind_name(k), r.bubble_fraction(), formula,
                    p.total, v > 1 ? " (chunks)" : "");
      }
    }
  }
  return 0;
}
