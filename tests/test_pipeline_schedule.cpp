// Pipeline schedules without MPI: GPipe's clock cycles as the course gives them; for every
// schedule over a grid of (S, M, v): each (micro-batch, chunk) is computed exactly once per kind,
// F before B before W on each stage, every message has one matching receive, simulating all
// stages together completes (no deadlock) with the cross-stage dependencies holding, and the
// activation memory stays within the schedule's bound; the simulated bubble against the formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "model/transformer.h"
#include "pipeline/stage_layers.h"
#include "pipeline/schedule.h"
#include "runtime/config.h"
#include "runtime/error.h"

using namespace llmpi;

namespace {

// The forward clock cycles of a simulation with unit costs: cycle t lists (micro-batch, stage)
// of every forward that starts at time t, by stage.
std::vector<std::vector<std::pair<int, int>>> forward_cycles(const SimResult& r) {
  std::map<int, std::vector<std::pair<int, int>>> by_tick;
  for (const SimEvent& e : r.events)
    if (e.action.type == ActionType::F) by_tick[(int)e.start].push_back({e.action.mb, e.stage});
  std::vector<std::vector<std::pair<int, int>>> out;
  for (auto& [t, v] : by_tick) {
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second < b.second; });
    out.push_back(v);
  }
  return out;
}

const ScheduleKind kAll[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                             ScheduleKind::zb_h1};

}  // namespace

TEST(PipelineSchedule, GPipeClockCycles) {
  using Cycles = std::vector<std::vector<std::pair<int, int>>>;
  // backward cost 1 as well: the forward phase does not depend on it
  const Cycles m6s2 = {{{0, 0}}, {{1, 0}, {0, 1}}, {{2, 0}, {1, 1}}, {{3, 0}, {2, 1}},
                       {{4, 0}, {3, 1}}, {{5, 0}, {4, 1}}, {{5, 1}}};
  EXPECT_EQ(forward_cycles(simulate_schedule(ScheduleKind::gpipe, 2, 6, 1, 1, 1, 1)), m6s2);
  const Cycles m3s3 = {{{0, 0}}, {{1, 0}, {0, 1}}, {{2, 0}, {1, 1}, {0, 2}}, {{2, 1}, {1, 2}}, {{2, 2}}};
  EXPECT_EQ(forward_cycles(simulate_schedule(ScheduleKind::gpipe, 3, 3, 1, 1, 1, 1)), m3s3);
}

TEST(PipelineSchedule, OneFOneBOrderIsTheTextbookOne) {
  // S = 4, M = 6: stage 0 warms up with 3 forwards, the last stage alternates from the start.
  auto computes = [](int stage) {
    std::string s;
    for (const Action& a : build_schedule(ScheduleKind::one_f_one_b, 4, 6, stage))
      if (a.is_compute()) s += action_string(a) + " ";
    return s;
  };
  EXPECT_EQ(computes(0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(computes(3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
}

TEST(PipelineSchedule, EveryScheduleIsCompleteOrderedAndDeadlockFree) {
  for (ScheduleKind kind : kAll) {
    for (int S : {1, 2, 3, 4, 5}) {
      for (int M : {1, 2, 3, 4, 6, 8, 12}) {
        for (int v : {1, 2, 3}) {
          if (kind != ScheduleKind::interleaved && v > 1) continue;
          if (kind == ScheduleKind::interleaved && (S < 2 || M % S != 0)) continue;
          const std::string where = std::string(schedule_kind_name(kind)) + " S=" + std::to_string(S) +
                                    " M=" + std::to_string(M) + " v=" + std::to_string(v);
          const bool split = kind == ScheduleKind::zb_h1;
          // messages: (from, to, is grad, micro-batch) sent and received
          std::multiset<std::tuple<int, int, int, int>> sends, recvs;
          for (int s = 0; s < S; s++) {
            const std::vector<Action> list = build_schedule(kind, S, M, s, v);
            std::map<std::pair<int, int>, int> f_at, b_at, w_at;  // (mb, chunk) -> position
            for (int i = 0; i < (int)list.size(); i++) {
              const Action& a = list[i];
              const auto key = std::make_pair(a.mb, a.chunk);
              ASSERT_TRUE(a.mb >= 0 && a.mb < M && a.chunk >= 0 && a.chunk < v) << where;
              switch (a.type) {
                case ActionType::F: ASSERT_TRUE(f_at.emplace(key, i).second) << where << " F twice"; break;
                case ActionType::B:
                  ASSERT_FALSE(split) << where;
                  ASSERT_TRUE(b_at.emplace(key, i).second) << where;
                  break;
                case ActionType::BI:
                  ASSERT_TRUE(split) << where;
                  ASSERT_TRUE(b_at.emplace(key, i).second) << where;
                  break;
                case ActionType::W: ASSERT_TRUE(w_at.emplace(key, i).second) << where; break;
                case ActionType::SendAct: sends.insert({s, a.peer, 0, a.mb}); break;
                case ActionType::SendGrad: sends.insert({s, a.peer, 1, a.mb}); break;
                case ActionType::RecvAct: recvs.insert({a.peer, s, 0, a.mb}); break;
                case ActionType::RecvGrad: recvs.insert({a.peer, s, 1, a.mb}); break;
              }
              // A receive is immediately followed by the compute that consumes it; a send
              // immediately follows the compute that produced it.
              if (a.type == ActionType::RecvAct) {
                ASSERT_LT(i + 1, (int)list.size());
                EXPECT_EQ(list[i + 1].type, ActionType::F) << where;
              }
              if (a.type == ActionType::SendGrad) {
                EXPECT_TRUE(list[i - 1].type == ActionType::B || list[i - 1].type == ActionType::BI) << where;
              }
            }
            ASSERT_EQ((int)f_at.size(), M * v) << where;
            ASSERT_EQ((int)b_at.size(), M * v) << where;
            ASSERT_EQ((int)w_at.size(), split ? M * v : 0) << where;
            for (auto& [key, i] : f_at) {
              EXPECT_LT(i, b_at[key]) << where << " stage " << s << ": F after B of micro-batch " << key.first;
              if (split) {
                EXPECT_LT(b_at[key], w_at[key]) << where << " stage " << s << ": W before B";
              }
            }
            const ActivationPeak peak = activation_peak(list, v);
            if (kind == ScheduleKind::one_f_one_b) {
              EXPECT_LE(peak.total, std::min(S - s, M)) << where;
            } else if (kind == ScheduleKind::zb_h1) {
              EXPECT_LE(peak.total, S) << where;
            } else if (kind == ScheduleKind::gpipe) {
              EXPECT_EQ(peak.total, M) << where;
            } else {
              EXPECT_LE(peak.total, std::min((S - s - 1) * 2 + (v - 1) * S + 1, M * v)) << where;
            }
          }
          EXPECT_EQ(sends, recvs) << where << ": every message needs exactly one matching receive";

          // All stages together: completes, and the data dependencies hold in time (Exact: integer
          // costs, so every time is an integer and each comparison exact).
          const SimResult r = simulate_schedule(kind, S, M, v, 1, 2, 1);
          ASSERT_TRUE(r.completed) << where << " deadlocks: " << r.stuck;
          const int K = S * v;
          // end of F / start of B(or BI) of (virtual stage, micro-batch)
          std::map<std::pair<int, int>, double> f_end, f_start, b_end, b_start;
          for (const SimEvent& e : r.events) {
            const int k = virtual_stage(S, e.stage, e.action.chunk);
            if (e.action.type == ActionType::F) f_start[{k, e.action.mb}] = e.start, f_end[{k, e.action.mb}] = e.end;
            if (e.action.type == ActionType::B || e.action.type == ActionType::BI)
              b_start[{k, e.action.mb}] = e.start, b_end[{k, e.action.mb}] = e.end;
          }
          for (int m = 0; m < M; m++) {
            for (int k = 0; k < K; k++) {
              auto at = [m](std::map<std::pair<int, int>, double>& t, int vk) { return t[std::make_pair(vk, m)]; };
              if (k > 0) {
                EXPECT_GE(at(f_start, k), at(f_end, k - 1)) << where << " F of vstage " << k;
              }
              if (k < K - 1) {
                EXPECT_GE(at(b_start, k), at(b_end, k + 1)) << where << " B of vstage " << k;
              }
              EXPECT_GE(at(b_start, k), at(f_end, k)) << where;
            }
          }
        }
      }
    }
  }
}

// NCCL matches the messages between two ranks by the order they are posted, not by tag
// (comm/stage_link.h): for each direction between two stages, the sender's list must send the
// messages in the order the receiver's list receives them.
TEST(PipelineSchedule, EachDirectionSendsInTheOrderItsPeerReceives) {
  for (ScheduleKind kind : kAll) {
    for (int S : {2, 3, 4, 5}) {
      for (int M : {1, 2, 3, 4, 6, 8, 12}) {
        for (int v : {1, 2, 3}) {
          if (kind != ScheduleKind::interleaved && v > 1) continue;
          if (kind == ScheduleKind::interleaved && M % S != 0) continue;
          const std::string where = std::string(schedule_kind_name(kind)) + " S=" + std::to_string(S) +
                                    " M=" + std::to_string(M) + " v=" + std::to_string(v);
          // (from, to) -> the messages in list order, each (is grad, micro-batch, receiver's virtual stage)
          std::map<std::pair<int, int>, std::vector<std::tuple<int, int, int>>> sent, received;
          size_t messages = 0;
          for (int s = 0; s < S; s++) {
            for (const Action& a : build_schedule(kind, S, M, s, v)) {
              const int k = virtual_stage(S, s, a.chunk);
              if (a.type == ActionType::SendAct || a.type == ActionType::SendGrad) {
                const bool grad = a.type == ActionType::SendGrad;
                sent[{s, a.peer}].push_back({grad, a.mb, grad ? k - 1 : k + 1});
                messages++;
              } else if (a.type == ActionType::RecvAct || a.type == ActionType::RecvGrad) {
                received[{a.peer, s}].push_back({a.type == ActionType::RecvGrad, a.mb, k});
              }
            }
          }
          EXPECT_GT(messages, 0u) << where;
          EXPECT_EQ(sent, received) << where;
        }
      }
    }
  }
}

TEST(PipelineSchedule, SimulatedBubbleMatchesTheFormulas) {
  // Bound: every simulated time is a sum of halves and integers (exact), so 1 − busy/S/makespan
  // rounds only in its quotient and its subtraction (each ≤ u·1, u = 2^-53) and the formula in its
  // own quotient (≤ u): 3u.
  const double tol = 3 * 0x1p-53;
  for (int S : {2, 4}) {
    for (int M : {4, 8, 16}) {
      // GPipe and 1F1B: (S-1)/(M+S-1) with any F:B ratio.
      const double classic = (double)(S - 1) / (M + S - 1);
      EXPECT_NEAR(simulate_schedule(ScheduleKind::gpipe, S, M).bubble_fraction(), classic, tol);
      EXPECT_NEAR(simulate_schedule(ScheduleKind::one_f_one_b, S, M).bubble_fraction(), classic, tol);
      // Interleaved with v chunks (each chunk 1/v of the stage's work): (S-1)/(v·M + S-1).
      const int v = 2;
      if (M % S == 0) {
        const SimResult r = simulate_schedule(ScheduleKind::interleaved, S, M, v, 1.0 / v, 2.0 / v, 1.0 / v);
        EXPECT_NEAR(r.bubble_fraction(), (double)(S - 1) / (v * M + S - 1), tol) << "S=" << S << " M=" << M;
      }
      // zb-h1 with F = B = W: idle (S-1)·(F+B-W) per stage instead of 1F1B's (S-1)·(F+B+W), a third.
      const SimResult z = simulate_schedule(ScheduleKind::zb_h1, S, M, 1, 1, 2, 1);
      const double zb = (double)(S - 1) / (3.0 * M + S - 1);
      EXPECT_NEAR(z.bubble_fraction(), zb, tol) << "S=" << S << " M=" << M;
    }
  }
}

TEST(PipelineSchedule, BadParametersAreRefused) {
  EXPECT_THROW(parse_schedule_kind("pipedream"), Error);
  EXPECT_THROW(check_schedule_params(ScheduleKind::interleaved, 4, 6, 2), Error);
  EXPECT_THROW(check_schedule_params(ScheduleKind::one_f_one_b, 2, 4, 2), Error);
  EXPECT_THROW(check_schedule_params(ScheduleKind::gpipe, 2, 0, 1), Error);
  EXPECT_NO_THROW(check_schedule_params(ScheduleKind::interleaved, 4, 8, 2));
}

// Layers per stage: explicit counts are checked, and the balanced split puts fewer blocks where
// the embedding or head cost is (the LM head of a large vocabulary is worth several blocks).
TEST(PipelineSchedule, LayerSplitBalancesEstimatedCost) {
  const Config cfg = parse_config("{}", "test", {"data.train=unused.h5", "model.n_layer=8", "model.n_head=2",
                                                 "model.d_model=64", "model.seq_len=32"});
  ModelDesc d = model_desc_from_config(cfg.model, 64);
  EXPECT_EQ(split_layers(d, 32, 2, {3, 5}), (std::vector<int>{3, 5}));
  EXPECT_THROW(split_layers(d, 32, 2, {3, 4}), Error);
  EXPECT_THROW(split_layers(d, 32, 3, {4, 4}), Error);
  EXPECT_THROW(split_layers(d, 32, 9, {}), Error);
  d.vocab_size = 64;  // a cheap head: an even split
  EXPECT_EQ(split_layers(d, 32, 2, {}), (std::vector<int>{4, 4}));
  EXPECT_EQ(split_layers(d, 32, 4, {}), (std::vector<int>{2, 2, 2, 2}));
  d.vocab_size = 50257;  // a head worth many blocks: the last stage gets the fewest
  const std::vector<int> c = split_layers(d, 32, 4, {});
  int sum = 0;
  for (int n : c) {
    sum += n;
    EXPECT_GE(n, 1);
  }
  EXPECT_EQ(sum, 8);
  EXPECT_EQ(c.back(), *std::min_element(c.begin(), c.end()));
  EXPECT_LT(c.back(), c.front());
  const ModelPart last = virtual_stage_part(c, 3);
  EXPECT_EQ(last.l1, 8);
  EXPECT_TRUE(last.head);
  EXPECT_FALSE(last.embedding);
  EXPECT_TRUE(virtual_stage_part(c, 0).embedding);
}
