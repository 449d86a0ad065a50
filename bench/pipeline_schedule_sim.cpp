// bench-pipeline_schedule_sim: the pipeline schedules under a per-stage compute model (no MPI:
// every stage computes F, B, BI and W in the given costs and messages are instant), the
// reference the measured traces are compared against (docs/PIPELINE.md).
//
//   build/bench-pipeline_schedule_sim [--f 1] [--b 2] [--bi 1] [--json OUT]
//   build/bench-pipeline_schedule_sim --measure [--family gpt2] [--layers 4] [--d-model 128]
//                                     [--heads 4] [--seq 128] [--rows 2] [--reps 15]
//                                     [--stat ratio|min|median] [--json OUT]
//
// Unit costs (the default): F, B = BI + W as given. With --measure the costs are measured: one
// pipeline stage of `--layers` blocks (no embedding, no head: a middle stage) runs a micro-batch
// of `--rows` sequences of `--seq` tokens on one thread, and F (forward), B (whole backward), BI
// (input-only backward) and W (its weight_backward) are timed, the four in turn within each of
// `--reps` repetitions after a warm-up. On a shared machine other jobs stretch every time; the
// four of one repetition run back to back, so the simulation takes by default each repetition's
// ratios F/B, BI/B, W/B (median over the repetitions) on the scale of the least disturbed B
// (--stat ratio; min and median are printed too, and selectable). The bubble fractions depend on
// the ratios only, the step times on the scale. The 1F1B-family schedules are simulated
// with (F, B), zb-h1 with (F, BI, W): its W is the real deferred half, BI + W costs what the split
// really costs (the copies of the kept output gradients included).
//
// For S in {2, 4, 8} and M in {S, 2S, 4S, 8S}: each schedule's simulated bubble fraction (1 −
// mean busy / makespan) next to its formula — GPipe and 1F1B (S-1)/(M+S-1), interleaved with v = 2
// chunks (S-1)/(v·M+S-1), zb-h1 (S-1)(F+BI-W) / (M(F+BI+W) + (S-1)(F+BI-W)), which is
// (S-1)/(3M+S-1) when F = BI = W — the makespan (with --measure: ms per step of M micro-batches),
// and the peak number of micro-batches whose activations stage 0 holds (GPipe M, 1F1B S,
// interleaved (S-1)·2+(v-1)·S+1 chunk-micro-batches of half the layers, zb-h1 S).
#include <CLI/CLI.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "runtime/clock.h"
#include "model/transformer.h"
#include "pipeline/schedule.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/rng.h"

extern "C" void openblas_set_num_threads(int num_threads);

using namespace llmpi;

namespace {

struct Costs {
  double f = 1, b = 2, bi = 1, w = 1;  // w: zb-h1's W (b - bi in the unit model)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times F, B, BI and W of one middle stage (see the header), in ms.
Costs measure(const std::string& family, int layers, int d_model, int heads, int T, int rows, int reps,
              const std::string& stat) {
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  ModelConfig mc = parse_config("{}", "bench", {"data.train=-", "model.family=" + family}).model;
  mc.n_layer = layers;
  mc.n_head = heads;
  mc.d_model = d_model;
  mc.seq_len = T;
  const ModelDesc d = model_desc_from_config(mc, 256);
  const ModelPart stage{0, layers, false, false};
  Model whole(d, cpu_ops(), stage), split(d, cpu_ops(), stage);
  whole.init_params(1);
  split.init_params(1);
  Activations aw(whole, rows, T), as(split, rows, T);
  split.reserve_input_only(as);
  std::vector<int32_t> tokens((size_t)rows * T, 1);
  Batch b;
  b.B = rows;
  b.T = T;
  b.tokens = tokens.data();
  whole.load_batch(aw, b);
  split.load_batch(as, b);
  Rng rng(7);
  const size_t NC = (size_t)rows * T * d_model;
  for (size_t i = 0; i < NC; i++) aw.input[i] = as.input[i] = (float)(rng.normal() * 0.5);
  std::vector<double> tf, tb, tbi, tw;
  for (int r = -2; r < reps; r++) {  // two warm-up rounds
    double t0 = now_ms();
    whole.blocks_forward(aw, 0, layers);
    const double f = now_ms() - t0;
    split.blocks_forward(as, 0, layers);
    for (size_t i = 0; i < NC; i++) aw.dresidual[i] = as.dresidual[i] = (float)(i % 7) * 1e-3f;
    t0 = now_ms();
    whole.begin_backward();
    whole.blocks_backward(aw, 0, layers, {});
    const double bw = now_ms() - t0;
    t0 = now_ms();
    split.begin_backward(as, BackwardMode::input_only);
    split.blocks_backward(as, 0, layers, {});
    const double bi = now_ms() - t0;
    t0 = now_ms();
    split.weight_backward(as, {});
    const double w = now_ms() - t0;
    if (r >= 0) {
      tf.push_back(f);
      tb.push_back(bw);
      tbi.push_back(bi);
      tw.push_back(w);
    }
  }
  auto lo = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  // Each repetition times the four back to back, so its ratios to its own B cancel the machine's
  // slower load changes: the median ratio, on the scale of the least disturbed B.
  std::vector<double> rf, rbi, rw;
  for (size_t i = 0; i < tb.size(); i++) {
    rf.push_back(tf[i] / tb[i]);
    rbi.push_back(tbi[i] / tb[i]);
    rw.push_back(tw[i] / tb[i]);
  }
  const double b0 = lo(tb);
  const Costs med{median(tf), median(tb), median(tbi), median(tw)}, mins{lo(tf), b0, lo(tbi), lo(tw)},
      ratio{median(rf) * b0, b0, median(rbi) * b0, median(rw) * b0};
  std::printf("measured: %s stage of %d blocks, d_model %d, %d heads, %d x %d tokens per micro-batch, 1 thread, "
              "%d repetitions\n", family.c_str(), layers, d_model, heads, rows, T, reps);
  for (const auto& [name, c] :
       {std::pair<const char*, Costs>{"median", med}, {"minimum", mins}, {"ratio", ratio}})
    std::printf("  %-8s F %.2f ms, B %.2f ms, BI %.2f ms + W %.2f ms = %.2f ms (%.3f x B)\n", name, c.f, c.b, c.bi, c.w,
                c.bi + c.w, (c.bi + c.w) / c.b);
  std::printf("simulated with the %s costs\n", stat.c_str());
  return stat == "min" ? mins : stat == "median" ? med : ratio;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-pipeline_schedule_sim: pipeline schedules under a per-stage compute model"};
  Costs c;
  bool do_measure = false;
  std::string family = "gpt2", json_out, stat = "ratio";
  int layers = 4, d_model = 128, heads = 4, seq = 128, rows = 2, reps = 15;
  app.add_option("--f", c.f, "unit model: forward cost")->capture_default_str();
  app.add_option("--b", c.b, "unit model: whole backward cost")->capture_default_str();
  app.add_option("--bi", c.bi, "unit model: input-only backward cost (W = B - BI)")->capture_default_str();
  app.add_flag("--measure", do_measure, "measure F, B, BI, W of one stage instead");
  app.add_option("--family", family, "--measure: gpt2 | llama")->capture_default_str();
  app.add_option("--layers", layers, "--measure: blocks in the stage")->capture_default_str();
  app.add_option("--d-model", d_model)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence")->capture_default_str();
  app.add_option("--rows", rows, "sequences per micro-batch")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median)")->capture_default_str();
  app.add_option("--stat", stat,
                 "--measure: simulate with ratio (median of each repetition's F/B, BI/B, W/B times the least B), "
                 "min or median over the repetitions")
      ->capture_default_str();
  app.add_option("--json", json_out, "write the table here");
  CLI11_PARSE(app, argc, argv);
  try {
    c.w = c.b - c.bi;
    if (do_measure) {
      if (layers < 1 || rows < 1 || reps < 1) fail("need --layers, --rows and --reps >= 1");
      if (stat != "min" && stat != "median" && stat != "ratio") fail("--stat must be ratio, min or median, got ", stat);
      c = measure(family, layers, d_model, heads, seq, rows, reps, stat);
    } else {
      std::printf("costs: F %.2f, B %.2f (B_input %.2f + W %.2f)\n", c.f, c.b, c.bi, c.w);
    }
    nlohmann::json out = {{"costs", {{"F", c.f}, {"B", c.b}, {"BI", c.bi}, {"W", c.w}}},
                          {"measured", do_measure}, {"rows", nlohmann::json::array()}};
    if (do_measure)
      out["stage"] = {{"family", family}, {"layers", layers}, {"d_model", d_model}, {"heads", heads},
                      {"seq", seq}, {"rows", rows}, {"reps", reps}, {"stat", stat}};
    std::printf("%3s %4s  %-12s %9s %9s %12s %14s\n", "S", "M", "schedule", "bubble", "formula",
                do_measure ? "step_ms" : "makespan", "peak acts st.0");
    const ScheduleKind kinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                  ScheduleKind::zb_h1};
    for (int S : {2, 4, 8}) {
      for (int M : {S, 2 * S, 4 * S, 8 * S}) {
        for (ScheduleKind k : kinds) {
          const int v = k == ScheduleKind::interleaved ? 2 : 1;
          const bool split = k == ScheduleKind::zb_h1;
          // Interleaved chunks hold 1/v of a stage's layers: each costs 1/v.
          const double b = split ? c.bi + c.w : c.b;  // BI is used by zb-h1 only
          const SimResult r = simulate_schedule(k, S, M, v, c.f / v, b / v, c.bi / v);
          double formula = (double)(S - 1) / (v * M + S - 1);
          if (split) {  // idle (S-1)·(F + BI - W) per stage
            const double idle = (S - 1) * (c.f + c.bi - c.w);
            formula = idle / (M * (c.f + c.bi + c.w) + idle);
          }
          const ActivationPeak p = activation_peak(build_schedule(k, S, M, 0, v), v);
          std::printf("%3d %4d  %-12s %9.4f %9.4f %12.2f %10d%s\n", S, M, schedule_kind_name(k), r.bubble_fraction(),
                      formula, r.makespan, p.total, v > 1 ? " (chunks)" : "");
          out["rows"].push_back({{"S", S}, {"M", M}, {"schedule", schedule_kind_name(k)}, {"v", v},
                                 {"bubble", r.bubble_fraction()}, {"formula", formula}, {"makespan", r.makespan},
                                 {"peak_stage0", p.total}});
        }
      }
    }
    if (!json_out.empty()) {
      std::ofstream f(json_out);
      f << out.dump(1) << "\n";
      if (!f) fail("cannot write ", json_out);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench-pipeline_schedule_sim: %s\n", e.what());
    return 1;
  }
  return 0;
}
