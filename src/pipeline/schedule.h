// Pipeline schedules as data: a pure function (kind, S stages, M micro-batches, stage, v chunks)
// → the ordered list of actions that stage runs in one training step. No MPI here; the runtime
// (engine/engine.h) executes a list, the tests simulate all S lists together.
//
// Actions. F(m, c): forward of micro-batch m through model chunk c of this stage. B(m, c): its
// whole backward (input and weight gradients). BI(m, c) / W(m, c): the backward split into the
// input gradient (what the previous stage waits for) and the weight gradient (what nobody waits
// for), as zero-bubble schedules use it. RecvAct / SendAct move a hidden state forward between
// neighbouring stages, RecvGrad / SendGrad its gradient backward. A Recv sits right before the
// compute that consumes it, a Send right after the compute that produces it; the runtime posts
// both non-blocking in list order and waits for a receive only when its compute starts, so the
// forward-send / backward-send crossing that deadlocks blocking sends cannot happen.
//
// Chunks (interleaved only, v > 1): the model is cut into S·v virtual stages; stage s holds
// chunks c = 0..v-1, which are virtual stages c·S + s (Megatron's layout). A hidden state leaves
// virtual stage k for k + 1: stage s chunk c → stage s+1 chunk c, and stage S-1 chunk c → stage 0
// chunk c+1. Without interleaving v = 1 and every chunk is 0.
//
// The schedules (stage s of S, micro-batches 0..M-1):
//   gpipe        all F in order, then all B in order (holds M micro-batches of activations)
//   1f1b         PipeDream-flush / DAPPLE: min(S-s-1, M) warm-up F, then alternate F and B, then
//                the remaining B; at most S-s micro-batches held
//   interleaved  Megatron's interleaved 1F1B over v chunks (needs M % S == 0): warm-up of
//                (S-s-1)·2 + (v-1)·S chunk-forwards, then one F and one B alternately; at most
//                that warm-up + 1 chunk-micro-batches held
//   zb-h1        zero-bubble H1 (Qi et al., ICLR 2024): the 1F1B order with B split into BI and
//                W; stage s defers its W by s micro-batches (W fills the cool-down bubble), so at
//                most S micro-batches are held (the 1F1B peak, on every stage)
#pragma once
#include <string>
#include <vector>

#include "runtime/options.h"

namespace llmpi {

ScheduleKind parse_schedule_kind(const std::string& name);  // throws Error naming the valid ones
const char* schedule_kind_name(ScheduleKind k);

enum class ActionType { F, B, BI, W, RecvAct, SendAct, RecvGrad, SendGrad };
const char* action_type_name(ActionType t);

struct Action {
  ActionType type;
  int mb = 0;     // micro-batch
  int chunk = 0;  // model chunk on this stage (0 unless interleaved)
  int peer = -1;  // Send/Recv: the other stage
  bool is_compute() const { return type == ActionType::F || type == ActionType::B || type == ActionType::BI ||
                                   type == ActionType::W; }
  bool operator==(const Action& o) const {
    return type == o.type && mb == o.mb && chunk == o.chunk && peer == o.peer;
  }
};
std::string action_string(const Action& a);  // "F3", "B0.1" (chunk 1), "SendAct3->2", ...

// Throws Error when (kind, S, M, v) is not a valid combination (S ≥ 1, M ≥ 1, v ≥ 1 and v = 1
// unless interleaved; interleaved needs M % S == 0).
void check_schedule_params(ScheduleKind kind, int S, int M, int v);

// The actions of `stage` (0-based) for one step.
std::vector<Action> build_schedule(ScheduleKind kind, int S, int M, int stage, int v = 1);

// Virtual stage of (stage, chunk) and the number of virtual stages.
inline int virtual_stage(int S, int stage, int chunk) { return chunk * S + stage; }

// The most micro-batches whose activations one stage holds at once (counted per chunk: a forward
// allocates, B or W releases), i.e. the activation slots the runtime needs per chunk and in total.
struct ActivationPeak {
  int total = 0;                 // over all chunks of the stage
  std::vector<int> per_chunk;    // size v
};
ActivationPeak activation_peak(const std::vector<Action>& actions, int v);

// Simulation of all S lists together, with compute costs f, b (the whole backward; BI and W cost
// b_input and b - b_input) and instant messages: a stage runs its list in order, a compute starts
// when the stage is free and its received input has arrived. Sends never block. Used by the
// tests (no deadlock, dependencies, clock cycles), for the expected bubble fraction, and by
// llmpi-plan with a cost per stage and a message time (the second form).
struct SimEvent {
  int stage;
  Action action;
  double start, end;
};
struct SimResult {
  bool completed = false;         // false: some stage waits forever (deadlock)
  std::string stuck;              // when not completed: what each stuck stage waits for
  std::vector<SimEvent> events;   // compute actions, in the order they were simulated
  double makespan = 0;
  std::vector<double> busy;       // per stage: time spent computing
  std::vector<double> end;        // per stage: when its last compute ends
  double bubble_fraction() const; // 1 - mean(busy) / makespan
};
SimResult simulate_schedule(ScheduleKind kind, int S, int M, int v = 1, double f = 1, double b = 2,
                            double b_input = 1);
// The same with stage s's costs in cost[s] and messages that take time: one sent at t across
// boundary k (between stages k and k+1; k = S-1 for the wrap between the last stage and the first)
// arrives at t + msg_s[k] (0 where msg_s has no entry).
struct StageCost {
  double f = 0, b = 0, bi = 0;  // bi ≤ b; W = b − bi
};
SimResult simulate_schedule(ScheduleKind kind, int S, int M, int v, const std::vector<StageCost>& cost,
                            const std::vector<double>& msg_s);

}  // namespace llmpi
