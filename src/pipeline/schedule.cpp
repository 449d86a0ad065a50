#include "pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "runtime/error.h"

namespace llmpi {

ScheduleKind parse_schedule_kind(const std::string& name) {
  ScheduleKind k{};
  if (!parse_option(name, &k))
    fail("parallel.schedule must be ", option_words<ScheduleKind>(), ", got \"", name, "\"");
  return k;
}

const char* schedule_kind_name(ScheduleKind k) { return option_name(k); }

const char* action_type_name(ActionType t) {
  switch (t) {
    case ActionType::F: return "F";
    case ActionType::B: return "B";
    case ActionType::BI: return "BI";
    case ActionType::W: return "W";
    case ActionType::RecvAct: return "RecvAct";
    case ActionType::SendAct: return "SendAct";
    case ActionType::RecvGrad: return "RecvGrad";
    case ActionType::SendGrad: return "SendGrad";
  }
  return "?";
}

std::string action_string(const Action& a) {
  std::string s = action_type_name(a.type) + std::to_string(a.mb);
  if (a.chunk) s += "." + std::to_string(a.chunk);
  if (!a.is_compute()) s += (a.type == ActionType::SendAct || a.type == ActionType::SendGrad ? "->" : "<-") +
                            std::to_string(a.peer);
  return s;
}

void check_schedule_params(ScheduleKind kind, int S, int M, int v) {
  if (S < 1) fail("parallel.pp_stages must be >= 1, got ", S);
  if (M < 1) fail("parallel.microbatches must be >= 1, got ", M);
  if (v < 1) fail("parallel.virtual_stages must be >= 1, got ", v);
  if (kind != ScheduleKind::interleaved && v != 1)
    fail("parallel.virtual_stages ", v, " needs parallel.schedule \"interleaved\" (schedule \"",
         schedule_kind_name(kind), "\" runs one chunk per stage): set parallel.virtual_stages=1");
  if (kind == ScheduleKind::interleaved) {
    if (S < 2) fail("parallel.schedule \"interleaved\" needs parallel.pp_stages >= 2");
    if (M % S != 0)
      fail("parallel.schedule \"interleaved\" needs parallel.microbatches (", M, ") to be a multiple of "
           "parallel.pp_stages (", S, "): set parallel.microbatches to ", (M / S + 1) * S);
  }
}

namespace {

// Appends compute actions with the messages around them (see the header).
struct Builder {
  int S, v, s;
  std::vector<Action> out;
  int K() const { return S * v; }
  int prev() const { return (s - 1 + S) % S; }
  int next() const { return (s + 1) % S; }
  void forward(int m, int c) {
    const int k = virtual_stage(S, s, c);
    if (k > 0) out.push_back({ActionType::RecvAct, m, c, prev()});
    out.push_back({ActionType::F, m, c});
    if (k < K() - 1) out.push_back({ActionType::SendAct, m, c, next()});
  }
  void backward(int m, int c, ActionType t) {  // B or BI
    const int k = virtual_stage(S, s, c);
    if (k < K() - 1) out.push_back({ActionType::RecvGrad, m, c, next()});
    out.push_back({t, m, c});
    if (k > 0) out.push_back({ActionType::SendGrad, m, c, prev()});
  }
  void weight(int m, int c) { out.push_back({ActionType::W, m, c}); }
};

}  // namespace

std::vector<Action> build_schedule(ScheduleKind kind, int S, int M, int stage, int v) {
  check_schedule_params(kind, S, M, v);
  if (stage < 0 || stage >= S) fail("internal: stage ", stage, " of ", S);
  Builder b{S, v, stage, {}};
  const int s = stage;
  switch (kind) {
    case ScheduleKind::gpipe:
      for (int m = 0; m < M; m++) b.forward(m, 0);
      for (int m = 0; m < M; m++) b.backward(m, 0, ActionType::B);
      break;
    case ScheduleKind::one_f_one_b: {
      const int warm = std::min(S - s - 1, M);
      for (int m = 0; m < warm; m++) b.forward(m, 0);
      for (int i = 0; i < M - warm; i++) {
        b.forward(warm + i, 0);
        b.backward(i, 0, ActionType::B);
      }
      for (int m = M - warm; m < M; m++) b.backward(m, 0, ActionType::B);
      break;
    }
    case ScheduleKind::zb_h1: {
      // 1F1B with B = BI + W; W of micro-batch i waits until `defer` later input-backwards ran.
      const int warm = std::min(S - s - 1, M), defer = s;
      std::deque<int> pending;
      auto input_backward = [&](int m) {
        b.backward(m, 0, ActionType::BI);
        pending.push_back(m);
        while ((int)pending.size() > defer) {
          b.weight(pending.front(), 0);
          pending.pop_front();
        }
      };
      for (int m = 0; m < warm; m++) b.forward(m, 0);
      for (int i = 0; i < M - warm; i++) {
        b.forward(warm + i, 0);
        input_backward(i);
      }
      for (int m = M - warm; m < M; m++) input_backward(m);
      for (int m : pending) b.weight(m, 0);
      break;
    }
    case ScheduleKind::interleaved: {
      // Megatron's order: the k-th chunk-forward is micro-batch (k / (S·v))·S + k % S of chunk
      // (k mod S·v) / S; backward visits the chunks in reverse.
      const int total = M * v, group = S * v;
      auto mb = [&](int k) { return (k / group) * S + k % S; };
      auto fchunk = [&](int k) { return (k % group) / S; };
      auto bchunk = [&](int k) { return v - 1 - (k % group) / S; };
      const int warm = std::min((S - s - 1) * 2 + (v - 1) * S, total);
      for (int k = 0; k < warm; k++) b.forward(mb(k), fchunk(k));
      for (int i = 0; i < total - warm; i++) {
        b.forward(mb(warm + i), fchunk(warm + i));
        b.backward(mb(i), bchunk(i), ActionType::B);
      }
      for (int k = total - warm; k < total; k++) b.backward(mb(k), bchunk(k), ActionType::B);
      break;
    }
  }
  return b.out;
}

ActivationPeak activation_peak(const std::vector<Action>& actions, int v) {
  ActivationPeak p;
  p.per_chunk.assign(v, 0);
  std::vector<int> live(v, 0);
  int total = 0;
  for (const Action& a : actions) {
    if (a.type == ActionType::F) {
      live[a.chunk]++;
      total++;
      p.per_chunk[a.chunk] = std::max(p.per_chunk[a.chunk], live[a.chunk]);
      p.total = std::max(p.total, total);
    } else if (a.type == ActionType::B || a.type == ActionType::W) {
      live[a.chunk]--;
      total--;
    }
  }
  return p;
}

double SimResult::bubble_fraction() const {
  if (busy.empty() || makespan <= 0) return 0;
  double sum = 0;
  for (double x : busy) sum += x;
  return 1.0 - sum / busy.size() / makespan;
}

SimResult simulate_schedule(ScheduleKind kind, int S, int M, int v, double f, double b, double b_input) {
  return simulate_schedule(kind, S, M, v, std::vector<StageCost>(S, {f, b, b_input}), {});
}

SimResult simulate_schedule(ScheduleKind kind, int S, int M, int v, const std::vector<StageCost>& cost,
                            const std::vector<double>& msg_s) {
  std::vector<std::vector<Action>> lists(S);
  for (int s = 0; s < S; s++) lists[s] = build_schedule(kind, S, M, s, v);
  // A message is identified by (receiver stage, is gradient, micro-batch, receiver's chunk).
  std::map<std::tuple<int, int, int, int>, double> sent;
  std::vector<size_t> pos(S, 0);
  std::vector<double> clock(S, 0), ready(S, 0);
  SimResult r;
  r.busy.assign(S, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; s++) {
      while (pos[s] < lists[s].size()) {
        const Action& a = lists[s][pos[s]];
        if (a.type == ActionType::SendAct || a.type == ActionType::SendGrad) {
          const bool grad = a.type == ActionType::SendGrad;
          int chunk = a.chunk;
          if (!grad && s == S - 1) chunk++;
          if (grad && s == 0) chunk--;
          const size_t boundary = grad ? (s == 0 ? S - 1 : s - 1) : s;  // the wrap is boundary S-1
          sent[{a.peer, grad, a.mb, chunk}] = clock[s] + (boundary < msg_s.size() ? msg_s[boundary] : 0.0);
        } else if (a.type == ActionType::RecvAct || a.type == ActionType::RecvGrad) {
          auto it = sent.find({s, a.type == ActionType::RecvGrad, a.mb, a.chunk});
          if (it == sent.end()) break;  // wait
          ready[s] = std::max(ready[s], it->second);
        } else {
          const StageCost& c = cost[s];
          const double d = a.type == ActionType::F ? c.f : a.type == ActionType::B ? c.b
                           : a.type == ActionType::BI ? c.bi : c.b - c.bi;
          const double start = std::max(clock[s], ready[s]);
          clock[s] = start + d;
          ready[s] = 0;
          r.busy[s] += d;
          r.events.push_back({s, a, start, clock[s]});
        }
        pos[s]++;
        progress = true;
      }
    }
  }
  r.completed = true;
  r.end = clock;
  for (int s = 0; s < S; s++) {
    if (pos[s] < lists[s].size()) {
      r.completed = false;
      r.stuck += "stage " + std::to_string(s) + " waits at " + action_string(lists[s][pos[s]]) + "; ";
    }
    r.makespan = std::max(r.makespan, clock[s]);
  }
  return r;
}

}  // namespace llmpi
