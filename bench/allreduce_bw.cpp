// bench-allreduce_bw: the time and bandwidth of bare MPI collectives on float buffers, for given
// message sizes: the yardstick that parallel.sync "allreduce" (and ZeRO-1's reduce-scatter +
// all-gather) is compared against (same byte count, same ranks, same link, same MPI/UCX
// environment), and with --fit the alpha-beta model of the link that llmpi-plan reads.
//
//   mpiexec -n 2 build/bench-allreduce_bw [--op LIST] [--bytes N[,N...]] [--iters I] [--warmup W]
//                                        [--poll-us U] [--gap-ms G] [--max-seconds S] [--scale]
//                                        [--pairs P]
//                                        [--fit] [--json OUT]
//   build/bench-allreduce_bw --self-test          (checks the fit on synthetic points, no MPI traffic)
//
//   --op       comma list of (default allreduce):
//                allreduce       MPI_Allreduce(MPI_SUM, MPI_FLOAT), in place, N bytes
//                reduce_scatter  MPI_Reduce_scatter(MPI_SUM) of the N-byte buffer into a separate
//                                receive buffer of rank r's piece: n/p floats, +1 for the first
//                                n mod p ranks (n = N/4, p = world) — what ZeRO-1 does per bucket
//                allgather       what ZeRO-1's all-gather does (comm/mpi_exchange.cpp): MPI_Allgather
//                                of equal pieces of ceil(n/p) floats (the short ones padded) into a
//                                p-piece buffer, then each piece copied into place: N bytes in the
//                                end. Not MPI_Allgatherv, which the trainer avoids (MPICH 4.0's is
//                                two orders of magnitude slower when ranks share cores)
//                sendrecv        ping-pong of N bytes between rank pairs (see --pairs), reported
//                                as one-way time = round trip / 2; an odd last rank sits out
//   --bytes    message sizes in bytes, comma-separated (k/M/G suffixes = 1e3/1e6/1e9 bytes);
//              default 1048576,4194304,17094656 (17094656 = the reference model's fp32 gradient).
//              N is always the whole buffer (for reduce_scatter/allgather: the whole bucket)
//   --iters    timed iterations per size (default 20); --warmup untimed ones first (default 3)
//   --max-seconds  cap per op and size (default none): once the iterations so far (warm-up
//              included, slowest rank's time) exceed S seconds, skip the remaining warm-ups and
//              stop after at least 3 timed iterations; the number timed is reported ("iters")
//   --poll-us  0 (default): blocking calls. U > 0: the non-blocking call (MPI_Iallreduce,
//              MPI_Ireduce_scatter, MPI_Iallgather, MPI_Isend/Irecv) polled with MPI_Test,
//              sleeping U microseconds between polls (what grad_sync does with parallel.poll_us)
//   --gap-ms   sleep G ms before each iteration (default 0): the idle time a training step leaves
//              between gradient all-reduces (TCP restarts slow start on a connection idle > RTO)
//   --scale    allreduce and reduce_scatter: also multiply the result by 1/world inside the timed
//              region, as grad_sync does
//   --pairs    sendrecv partners: "neighbours" (default: (0,1), (2,3), ...) or "halves" (rank i
//              with i + p/2: with ranks placed node by node on two nodes every pair crosses the
//              link between them, all pairs at once)
//   --fit      per op, fit t(N) = a + b*N to the median times (see below) and report the alpha-beta
//              model's alpha and beta
//   --json     write the results there (rank 0; via OUT.tmp + rename)
//
// Every iteration refills the buffers (untimed), meets at a barrier, then times one operation;
// the iteration's time is the slowest rank's. Reported per op and size: median/min/max ms,
// algbw = bytes / time and busbw = algbw x (what each rank sends over its link per byte of N in
// the bandwidth-optimal algorithm: 2(p-1)/p for allreduce, (p-1)/p for reduce_scatter and
// allgather, 1 for sendrecv; nccl-tests' convention), in GB/s and Gbit/s.
// The first warm-up result of every op and size is checked element by element (allreduce and
// reduce_scatter: the sum of the ranks' values; allgather: every piece from its owner;
// sendrecv: the partner's values); a wrong element aborts the run.
//
// The fit. The alpha-beta model (Hockney) prices one message of m bytes over one link at
// alpha + beta*m; the bandwidth-optimal ring algorithms over p ranks then cost
//   allreduce        2(p-1) alpha + 2(p-1)/p beta N     (reduce-scatter then all-gather)
//   reduce_scatter    (p-1) alpha +  (p-1)/p beta N
//   allgather         (p-1) alpha +  (p-1)/p beta N
//   sendrecv                alpha +          beta N     (one way)
// so from the line t(N) = a + b*N: alpha = a / ka, beta = b / kb with (ka, kb) the factors above.
// For allreduce and reduce_scatter the reduction arithmetic (one add per received float) is
// folded into beta; the fitted values are "what the formula needs to reproduce the measurement"
// whatever algorithm MPICH really picks for that size (recursive doubling for small messages,
// Rabenseifner's recursive halving for large ones at a power-of-two p).
// Method: weighted least squares with relative errors, minimising sum_i ((a + b N_i - t_i) / t_i)^2
// (weights 1/t_i^2), because the sizes span decades: plain least squares would fit the largest
// sizes only and leave alpha to chance. A negative a is clamped to 0 (b refitted alone through
// the origin) and reported as "a_clamped". The largest relative residual |fit - t| / t is
// reported as the fit's quality.
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

const char* kProg = "bench-allreduce_bw";
const char* kUsage =
    "[--op allreduce,reduce_scatter,allgather,sendrecv] [--bytes N[,N...]] [--iters I] [--warmup W] "
    "[--poll-us U] [--gap-ms G] [--max-seconds S] [--scale] [--pairs neighbours|halves] [--fit] [--json OUT] | "
    "--self-test";

enum class Op { allreduce, reduce_scatter, allgather, sendrecv };
const char* op_name(Op op) {
  switch (op) {
    case Op::allreduce: return "allreduce";
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::allgather: return "allgather";
    case Op::sendrecv: return "sendrecv";
  }
  return "?";
}

struct Options {
  std::vector<Op> ops{Op::allreduce};
  std::vector<double> bytes{1048576, 4194304, 17094656};
  int iters = 20;
  int warmup = 3;
  int poll_us = 0;
  int gap_ms = 0;
  double max_seconds = 0;  // 0: no cap
  bool scale = false;
  bool halves = false;  // --pairs halves
  bool fit = false;
  bool self_test = false;
  std::string json;
};

[[noreturn]] void usage_error(int rank, const std::string& msg) {
  if (rank == 0) std::fprintf(stderr, "%s: error: %s\nusage: %s %s\n", kProg, msg.c_str(), kProg, kUsage);
  MPI_Finalize();
  std::exit(2);
}

double parse_size(const std::string& s, int rank) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suf = end ? end : "";
  if (suf == "k" || suf == "K") v *= 1e3;
  else if (suf == "M" || suf == "m") v *= 1e6;
  else if (suf == "G" || suf == "g") v *= 1e9;
  else if (!suf.empty() || end == s.c_str()) usage_error(rank, "--bytes: cannot read '" + s + "'");
  if (!(v >= 4) || v / 4 > 2147483647.0) usage_error(rank, "--bytes: '" + s + "' must be 4 .. 8e9");
  return v;
}

int parse_int(const char* flag, const char* s, int lo, int rank) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > 1000000000)
    usage_error(rank, std::string(flag) + " must be an integer >= " + std::to_string(lo) + ", got '" + s + "'");
  return (int)v;
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= list.size()) {
    size_t q = list.find(',', p);
    if (q == std::string::npos) q = list.size();
    out.push_back(list.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(rank, a + " needs a value");
      return argv[++i];
    };
    if (a == "--bytes") {
      o.bytes.clear();
      for (const std::string& s : split_commas(value())) o.bytes.push_back(parse_size(s, rank));
    } else if (a == "--op") {
      o.ops.clear();
      for (const std::string& s : split_commas(value())) {
        Op op;
        if (s == "allreduce") op = Op::allreduce;
        else if (s == "reduce_scatter") op = Op::reduce_scatter;
        else if (s == "allgather") op = Op::allgather;
        else if (s == "sendrecv") op = Op::sendrecv;
        else usage_error(rank, "--op: unknown op '" + s + "' (use allreduce, reduce_scatter, allgather, sendrecv)");
        if (std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end())
          usage_error(rank, "--op: '" + s + "' given twice");
        o.ops.push_back(op);
      }
    } else if (a == "--pairs") {
      std::string v = value();
      if (v == "neighbours" || v == "neighbors") o.halves = false;
      else if (v == "halves") o.halves = true;
      else usage_error(rank, "--pairs must be neighbours or halves, got '" + v + "'");
    } else if (a == "--iters") o.iters = parse_int("--iters", value(), 1, rank);
    else if (a == "--warmup") o.warmup = parse_int("--warmup", value(), 1, rank);
    else if (a == "--poll-us") o.poll_us = parse_int("--poll-us", value(), 0, rank);
    else if (a == "--gap-ms") o.gap_ms = parse_int("--gap-ms", value(), 0, rank);
    else if (a == "--max-seconds") o.max_seconds = parse_int("--max-seconds", value(), 1, rank);
    else if (a == "--scale") o.scale = true;
    else if (a == "--fit") o.fit = true;
    else if (a == "--self-test") o.self_test = true;
    else if (a == "--json") o.json = value();
    else if (a == "-h" || a == "--help") {
      if (rank == 0) std::printf("usage: %s %s\n(see the header of bench/allreduce_bw.cpp)\n", kProg, kUsage);
      MPI_Finalize();
      std::exit(0);
    } else usage_error(rank, "unknown argument '" + a + "'");
  }
  return o;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_str(const char* s) {
  std::string o = "\"";
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') o += '\\';
    if ((unsigned char)*s < 0x20) continue;
    o += *s;
  }
  return o + "\"";
}

// %.6g that JSON can read: a non-finite number becomes null
std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

struct Result {
  double bytes, median_ms, min_ms, max_ms;
  std::vector<double> times;  // the timed iterations (fewer than --iters when --max-seconds cut them)
};

// ---- the alpha-beta fit ---------------------------------------------------------------------

struct Fit {
  double a_s = NAN, b_s_per_byte = NAN;        // t(N) = a + b N, seconds
  double alpha_s = NAN, beta_s_per_byte = NAN;  // the model's latency and inverse bandwidth
  double gbit_s = NAN;                          // 8 / beta / 1e9
  double max_rel_residual = NAN;                // max_i |a + b N_i - t_i| / t_i
  bool a_clamped = false;
  bool ok = false;
};

// Weighted least squares, weights w_i = 1/t_i^2 (relative errors):
//   minimise sum_i w_i (a + b x_i - t_i)^2
//   normal equations  [S0 S1] [a]   [T0]     S0 = sum w, S1 = sum w x, S2 = sum w x^2,
//                     [S1 S2] [b] = [T1]     T0 = sum w t, T1 = sum w x t
//   a = (S2 T0 - S1 T1) / det, b = (S0 T1 - S1 T0) / det, det = S0 S2 - S1^2.
// If a < 0 (latency below the resolution of the sizes given): a = 0, b = T1 / S2 (the same
// weighted fit through the origin).
Fit fit_line(const std::vector<double>& x, const std::vector<double>& t) {
  Fit f;
  double S0 = 0, S1 = 0, S2 = 0, T0 = 0, T1 = 0;
  for (size_t i = 0; i < x.size(); i++) {
    if (!(t[i] > 0)) return f;
    const double w = 1.0 / (t[i] * t[i]);
    S0 += w;
    S1 += w * x[i];
    S2 += w * x[i] * x[i];
    T0 += w * t[i];
    T1 += w * x[i] * t[i];
  }
  const double det = S0 * S2 - S1 * S1;
  if (x.size() < 2 || !(std::fabs(det) > 1e-12 * S0 * S2)) return f;  // needs two distinct sizes
  f.a_s = (S2 * T0 - S1 * T1) / det;
  f.b_s_per_byte = (S0 * T1 - S1 * T0) / det;
  if (f.a_s < 0) {
    f.a_s = 0;
    f.b_s_per_byte = T1 / S2;
    f.a_clamped = true;
  }
  f.max_rel_residual = 0;
  for (size_t i = 0; i < x.size(); i++)
    f.max_rel_residual = std::max(f.max_rel_residual, std::fabs(f.a_s + f.b_s_per_byte * x[i] - t[i]) / t[i]);
  f.ok = true;
  return f;
}

// (ka, kb) of the op's cost a = ka alpha, b = kb beta on p ranks (see the header)
void model_factors(Op op, int p, double* ka, double* kb) {
  switch (op) {
    case Op::allreduce: *ka = 2.0 * (p - 1); *kb = 2.0 * (p - 1) / p; return;
    case Op::reduce_scatter:
    case Op::allgather: *ka = p - 1; *kb = (double)(p - 1) / p; return;
    case Op::sendrecv: *ka = 1; *kb = 1; return;
  }
}

Fit fit_op(Op op, int p, const std::vector<Result>& rs) {
  std::vector<double> x, t;
  for (const Result& r : rs) {
    x.push_back(r.bytes);
    t.push_back(r.median_ms * 1e-3);
  }
  Fit f = fit_line(x, t);
  if (!f.ok) return f;
  double ka = 0, kb = 0;
  model_factors(op, p, &ka, &kb);
  f.alpha_s = ka > 0 ? f.a_s / ka : NAN;
  f.beta_s_per_byte = kb > 0 ? f.b_s_per_byte / kb : NAN;
  f.gbit_s = f.beta_s_per_byte > 0 ? 8.0 / f.beta_s_per_byte / 1e9 : NAN;
  return f;
}

// --self-test: the fit recovers known lines (exact, with +-3% deterministic noise, with a
// negative intercept that must be clamped) and the formulas invert the model factors.
int self_test() {
  int failures = 0;
  auto check = [&](bool ok, const char* what, double got, double want) {
    std::printf("  %-48s got %-12.6g want %-12.6g %s\n", what, got, want, ok ? "ok" : "FAIL");
    if (!ok) failures++;
  };
  const std::vector<double> sizes{4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6, 64e6};
  const double a = 50e-6, b = 8.0 / 10e9;  // 50 us, 10 Gbit/s
  std::vector<double> exact, noisy, negative;
  for (size_t i = 0; i < sizes.size(); i++) {
    exact.push_back(a + b * sizes[i]);
    noisy.push_back((a + b * sizes[i]) * (1 + 0.03 * (i % 2 ? 1 : -1)));
    negative.push_back(-0.5e-6 + b * sizes[i]);  // a line with a = -0.5 us, all t > 0
  }
  std::printf("%s --self-test: the weighted least-squares fit on synthetic points\n", kProg);
  Fit f = fit_line(sizes, exact);
  check(f.ok && std::fabs(f.a_s / a - 1) < 1e-9, "exact line: a", f.a_s, a);
  check(f.ok && std::fabs(f.b_s_per_byte / b - 1) < 1e-9, "exact line: b", f.b_s_per_byte, b);
  check(f.ok && f.max_rel_residual < 1e-9 && !f.a_clamped, "exact line: max relative residual", f.max_rel_residual, 0);
  f = fit_line(sizes, noisy);
  check(f.ok && std::fabs(f.a_s / a - 1) < 0.1, "+-3% noise: a within 10%", f.a_s, a);
  check(f.ok && std::fabs(f.b_s_per_byte / b - 1) < 0.05, "+-3% noise: b within 5%", f.b_s_per_byte, b);
  check(f.ok && f.max_rel_residual > 0.02 && f.max_rel_residual < 0.06, "+-3% noise: max relative residual",
        f.max_rel_residual, 0.03);
  f = fit_line(sizes, negative);
  check(f.ok && f.a_clamped && f.a_s == 0, "negative intercept: a clamped to 0", f.a_s, 0);
  check(f.ok && std::fabs(f.b_s_per_byte / b - 1) < 0.05, "negative intercept: b within 5%", f.b_s_per_byte, b);
  f = fit_line({1e6, 1e6}, {1e-3, 1e-3});
  check(!f.ok, "one distinct size: no fit", f.ok, 0);
  // model inversion: a ring allreduce on 4 ranks of alpha 10 us, beta 1/(1 GB/s)
  const double alpha = 10e-6, beta = 1e-9;
  const Op ops[] = {Op::allreduce, Op::reduce_scatter, Op::allgather, Op::sendrecv};
  for (Op op : ops) {
    double ka = 0, kb = 0;
    model_factors(op, 4, &ka, &kb);
    std::vector<Result> rs;
    for (double n : sizes) rs.push_back({n, (ka * alpha + kb * beta * n) * 1e3, 0, 0, {}});
    Fit g = fit_op(op, 4, rs);
    std::string what = std::string(op_name(op)) + " p=4: alpha, Gbit/s";
    check(g.ok && std::fabs(g.alpha_s / alpha - 1) < 1e-6 && std::fabs(g.gbit_s / 8 - 1) < 1e-6, what.c_str(),
          g.alpha_s, alpha);
  }
  std::printf("%s --self-test: %s\n", kProg, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}

// ---- one op at one size ----------------------------------------------------------------------

// MPI_Test every poll_us microseconds until req completes (poll_us > 0), as grad_sync does
void wait_polling(MPI_Request* req, int poll_us) {
  int done = 0;
  MPI_Test(req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
  }
}

// sendrecv partner of rank, or -1 if it sits out (odd world)
int partner_of(int rank, int world, bool halves) {
  if (halves) {
    const int h = world / 2;
    return rank < h ? rank + h : rank - h;
  }
  if ((world % 2) && rank == world - 1) return -1;
  return rank ^ 1;
}

// the pieces of an n-float bucket over p ranks: n/p floats, +1 for the first n mod p ranks
void pieces(int n, int p, std::vector<int>* counts, std::vector<int>* displs) {
  counts->assign((size_t)p, 0);
  displs->assign((size_t)p, 0);
  for (int r = 0, off = 0; r < p; r++) {
    (*counts)[(size_t)r] = n / p + (r < n % p ? 1 : 0);
    (*displs)[(size_t)r] = off;
    off += (*counts)[(size_t)r];
  }
}

Result run_size(Op op, double bytes, const Options& o, int rank, int world) {
  const int count = (int)(bytes / sizeof(float));
  const int partner = op == Op::sendrecv ? partner_of(rank, world, o.halves) : -1;
  std::vector<int> counts, displs;
  pieces(count, world, &counts, &displs);
  const int mine = counts[(size_t)rank];
  // allreduce/allgather: buf in place; reduce_scatter: buf -> recv (my piece);
  // sendrecv: buf is sent, recv receives
  std::vector<float> buf((size_t)count);
  // allgather: the padded piece sent and the p pieces received (comm/mpi_exchange.cpp's layout)
  const int padded = (count + world - 1) / world;
  std::vector<float> recv(op == Op::reduce_scatter ? (size_t)mine
                          : op == Op::sendrecv    ? (size_t)count
                          : op == Op::allgather   ? (size_t)padded * world
                                                  : 0);
  std::vector<float> piece(op == Op::allgather ? (size_t)padded : 0);
  std::vector<double> times;
  const float inv = 1.0f / (float)world;
  // iterations: warm_left warm-ups, then timed ones up to --iters; --max-seconds cuts both short.
  // spent_ms sums the slowest rank's times, identical on every rank, so all ranks stop together.
  int warm_left = o.warmup;
  double spent_ms = 0;
  const double cap_ms = o.max_seconds * 1e3;
  for (int it = 0;; it++) {
    // refill (untimed): rank r contributes r + 1 everywhere; allgather: only r's own piece
    if (op == Op::allgather) {
      std::fill(buf.begin(), buf.end(), -1.0f);
      std::fill(buf.begin() + displs[(size_t)rank], buf.begin() + displs[(size_t)rank] + mine, (float)(rank + 1));
    } else {
      std::fill(buf.begin(), buf.end(), (float)(rank + 1));
    }
    std::fill(recv.begin(), recv.end(), 0.0f);
    if (o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_ms();
    MPI_Request req;
    switch (op) {
      case Op::allreduce:
        if (o.poll_us > 0) {
          MPI_Iallreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
          wait_polling(&req, o.poll_us);
        } else {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        if (o.scale)
          for (int i = 0; i < count; i++) buf[(size_t)i] *= inv;
        break;
      case Op::reduce_scatter:
        if (o.poll_us > 0) {
          MPI_Ireduce_scatter(buf.data(), recv.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
          wait_polling(&req, o.poll_us);
        } else {
          MPI_Reduce_scatter(buf.data(), recv.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        if (o.scale)
          for (int i = 0; i < mine; i++) recv[(size_t)i] *= inv;
        break;
      case Op::allgather:
        std::copy(buf.begin() + displs[(size_t)rank], buf.begin() + displs[(size_t)rank] + mine, piece.begin());
        if (o.poll_us > 0) {
          MPI_Iallgather(piece.data(), padded, MPI_FLOAT, recv.data(), padded, MPI_FLOAT, MPI_COMM_WORLD, &req);
          wait_polling(&req, o.poll_us);
        } else {
          MPI_Allgather(piece.data(), padded, MPI_FLOAT, recv.data(), padded, MPI_FLOAT, MPI_COMM_WORLD);
        }
        for (int r = 0; r < world; r++)
          std::copy(recv.begin() + (size_t)r * padded, recv.begin() + (size_t)r * padded + counts[(size_t)r],
                    buf.begin() + displs[(size_t)r]);
        break;
      case Op::sendrecv:
        // ping-pong: the lower rank of the pair sends first, the higher one answers
        if (partner >= 0) {
          const bool first = rank < partner;
          for (int leg = 0; leg < 2; leg++) {
            const bool sending = (leg == 0) == first;
            if (o.poll_us > 0) {
              if (sending) MPI_Isend(buf.data(), count, MPI_FLOAT, partner, 7, MPI_COMM_WORLD, &req);
              else MPI_Irecv(recv.data(), count, MPI_FLOAT, partner, 7, MPI_COMM_WORLD, &req);
              wait_polling(&req, o.poll_us);
            } else if (sending) {
              MPI_Send(buf.data(), count, MPI_FLOAT, partner, 7, MPI_COMM_WORLD);
            } else {
              MPI_Recv(recv.data(), count, MPI_FLOAT, partner, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
          }
        }
        break;
    }
    double dt = now_ms() - t0, slowest = 0;
    if (op == Op::sendrecv) dt = partner >= 0 ? dt / 2 : 0;  // one way = round trip / 2
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it == 0) {
      // check every element of the first warm-up result
      const float sum = (float)world * (world + 1) / 2 * (o.scale ? inv : 1.0f);
      long bad = 0;
      switch (op) {
        case Op::allreduce:
          for (int i = 0; i < count; i++) bad += buf[(size_t)i] != sum;
          break;
        case Op::reduce_scatter:
          for (int i = 0; i < mine; i++) bad += recv[(size_t)i] != sum;
          break;
        case Op::allgather:
          for (int r = 0; r < world; r++)
            for (int i = 0; i < counts[(size_t)r]; i++) bad += buf[(size_t)(displs[(size_t)r] + i)] != (float)(r + 1);
          break;
        case Op::sendrecv:
          if (partner >= 0)
            for (int i = 0; i < count; i++) bad += recv[(size_t)i] != (float)(partner + 1);
          break;
      }
      long bad_all = 0;
      MPI_Allreduce(&bad, &bad_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      if (bad_all) {
        if (rank == 0)
          std::fprintf(stderr, "%s: error: wrong %s result in %ld elements (%.0f bytes)\n", kProg, op_name(op), bad_all,
                       bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    spent_ms += slowest;
    if (warm_left > 0) {
      warm_left--;
      if (cap_ms > 0 && spent_ms > cap_ms) warm_left = 0;
    } else {
      times.push_back(slowest);
      if ((int)times.size() >= o.iters) break;
      if (cap_ms > 0 && times.size() >= 3 && spent_ms > cap_ms) break;
    }
  }
  return {(double)count * sizeof(float), median(times), *std::min_element(times.begin(), times.end()),
          *std::max_element(times.begin(), times.end()), times};
}

// bytes each rank sends over its link per byte of N (busbw factor; see the header)
double bus_factor(Op op, int world) {
  if (op == Op::sendrecv) return 1;
  if (world < 2) return 0;
  return (op == Op::allreduce ? 2.0 : 1.0) * (world - 1) / world;
}

std::string op_title(Op op, const Options& o, int world) {
  std::string mode = o.poll_us > 0 ? "non-blocking + MPI_Test every " + std::to_string(o.poll_us) + " us" : "blocking";
  std::string gap = o.gap_ms > 0 ? ", " + std::to_string(o.gap_ms) + " ms idle before each" : "";
  std::string what;
  switch (op) {
    case Op::allreduce:
      // today's line, word for word, when blocking
      what = std::string("MPI_Allreduce(MPI_SUM, float, in place)") + (o.scale ? " + scale by 1/world" : "");
      if (o.poll_us > 0) mode = "MPI_Iallreduce + MPI_Test every " + std::to_string(o.poll_us) + " us";
      break;
    case Op::reduce_scatter:
      what = std::string("MPI_Reduce_scatter(MPI_SUM, float, pieces n/p)") + (o.scale ? " + scale by 1/world" : "");
      break;
    case Op::allgather: what = "MPI_Allgather(float, equal padded pieces ceil(n/p), copied into place)"; break;
    case Op::sendrecv:
      what = std::string("MPI_Send/MPI_Recv ping-pong, one way = round trip / 2, pairs ") +
             (o.halves ? "(i, i+p/2)" : "(0,1),(2,3),...");
      break;
  }
  return what + ", " + std::to_string(world) + " ranks, " + mode + ", " + std::to_string(o.iters) + " iterations" +
         gap + " (median of slowest rank)";
}

struct OpResult {
  Op op;
  std::vector<Result> points;
  Fit fit;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const Options o = parse(argc, argv, rank);
  if (o.self_test) {
    const int rc = rank == 0 ? self_test() : 0;
    MPI_Finalize();
    return rc;
  }
  const bool has_sendrecv = std::find(o.ops.begin(), o.ops.end(), Op::sendrecv) != o.ops.end();
  if (has_sendrecv && world < 2) usage_error(rank, "--op sendrecv needs at least 2 ranks (mpiexec -n 2 ...)");
  if (has_sendrecv && o.halves && world % 2)
    usage_error(rank, "--pairs halves needs an even number of ranks, got " + std::to_string(world));
  if (o.fit && world < 2) usage_error(rank, "--fit needs at least 2 ranks (the model has p - 1 steps)");
  if (o.fit && o.bytes.size() < 2) usage_error(rank, "--fit needs at least 2 sizes in --bytes");

  std::vector<OpResult> all;
  for (Op op : o.ops) {
    OpResult r{op, {}, {}};
    for (double bytes : o.bytes) r.points.push_back(run_size(op, bytes, o, rank, world));
    if (o.fit) r.fit = fit_op(op, world, r.points);
    all.push_back(r);
  }

  if (rank == 0) {
    for (const OpResult& r : all) {
      const double bus = bus_factor(r.op, world);
      std::printf("%s\n", op_title(r.op, o, world).c_str());
      // (with --max-seconds a last column says how many iterations were timed)
      std::printf("%14s %10s %10s %10s %12s %12s %12s%s\n", "bytes", "median_ms", "min_ms", "max_ms", "algbw_GB/s",
                  "busbw_GB/s", "busbw_Gbit/s", o.max_seconds > 0 ? "  iters" : "");
      for (const Result& p : r.points) {
        const double alg = p.bytes / (p.median_ms * 1e6);
        std::printf("%14.0f %10.3f %10.3f %10.3f %12.3f %12.3f %12.3f", p.bytes, p.median_ms, p.min_ms, p.max_ms, alg,
                    alg * bus, alg * bus * 8);
        if (o.max_seconds > 0) std::printf(" %6zu", p.times.size());
        std::printf("\n");
      }
    }
    if (o.fit) {
      std::printf("alpha-beta fit, %d ranks: t(N) = a + b N over %zu sizes, weighted least squares (relative errors);\n"
                  "alpha = a/ka, beta = b/kb with (ka, kb) = (2(p-1), 2(p-1)/p) allreduce, ((p-1), (p-1)/p)\n"
                  "reduce_scatter and allgather, (1, 1) sendrecv; the reduction's arithmetic is part of beta\n",
                  world, o.bytes.size());
      std::printf("%-15s %10s %10s %10s %10s %9s %9s\n", "op", "a_us", "b_ns/B", "alpha_us", "beta_ns/B", "Gbit/s",
                  "max_resid");
      for (const OpResult& r : all) {
        const Fit& f = r.fit;
        if (!f.ok) {
          std::printf("%-15s (no fit: a median time is zero or the sizes are not distinct)\n", op_name(r.op));
          continue;
        }
        std::printf("%-15s %10.2f %10.4f %10.2f %10.4f %9.3f %8.1f%%%s\n", op_name(r.op), f.a_s * 1e6,
                    f.b_s_per_byte * 1e9, f.alpha_s * 1e6, f.beta_s_per_byte * 1e9, f.gbit_s,
                    f.max_rel_residual * 100, f.a_clamped ? "  (a < 0 clamped to 0)" : "");
        if (!(f.b_s_per_byte > 0)) std::printf("%-15s (b <= 0: the times do not grow with N; no bandwidth, gbit_s null)\n", "");
      }
    }
    if (!o.json.empty()) {
      const std::string tmp = o.json + ".tmp";
      FILE* f = std::fopen(tmp.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "%s: error: cannot write '%s': %s\n", kProg, tmp.c_str(), std::strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      char host[MPI_MAX_PROCESSOR_NAME] = {0};
      int len = 0;
      MPI_Get_processor_name(host, &len);
      std::fprintf(f, "{\n  \"benchmark\": \"allreduce_bw\",\n  \"ranks\": %d,\n  \"mode\": %s,\n  \"poll_us\": %d,\n  \"gap_ms\": %d,\n  \"scale\": %s,\n",
                   world, o.poll_us > 0 ? "\"iallreduce+test\"" : "\"allreduce\"", o.poll_us, o.gap_ms,
                   o.scale ? "true" : "false");
      std::fprintf(f, "  \"iters\": %d,\n  \"warmup\": %d,\n  \"max_seconds\": %g,\n  \"host\": %s,\n", o.iters, o.warmup,
                   o.max_seconds, json_str(host).c_str());
      std::fprintf(f, "  \"env\": {");
      const char* keys[] = {"UCX_TLS", "UCX_NET_DEVICES", "UCX_RNDV_THRESH", "MPIR_CVAR_NOLOCAL"};
      for (int k = 0; k < 4; k++)
        std::fprintf(f, "%s%s: %s", k ? ", " : "", json_str(keys[k]).c_str(),
                     std::getenv(keys[k]) ? json_str(std::getenv(keys[k])).c_str() : "null");
      // "results": the allreduce rows, as before (empty when --op has no allreduce)
      std::fprintf(f, "},\n  \"results\": [\n");
      const OpResult* ar = nullptr;
      for (const OpResult& r : all)
        if (r.op == Op::allreduce) ar = &r;
      const double bus_ar = bus_factor(Op::allreduce, world);
      for (size_t i = 0; ar && i < ar->points.size(); i++) {
        const Result& r = ar->points[i];
        const double alg = r.bytes / (r.median_ms * 1e6);
        std::fprintf(f,
                     "    {\"bytes\": %.0f, \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
                     "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"busbw_Gbps\": %.4f, \"times_ms\": [",
                     r.bytes, r.median_ms, r.min_ms, r.max_ms, alg, alg * bus_ar, alg * bus_ar * 8);
        for (size_t k = 0; k < r.times.size(); k++) std::fprintf(f, "%s%.4f", k ? ", " : "", r.times[k]);
        std::fprintf(f, "]}%s\n", i + 1 < ar->points.size() ? "," : "");
      }
      // "ops": every op measured, with its fit (null without --fit)
      std::fprintf(f, "  ],\n  \"pairs\": \"%s\",\n  \"fit_method\": %s,\n  \"ops\": [\n", o.halves ? "halves" : "neighbours",
                   o.fit ? "\"weighted least squares, weights 1/t^2 (relative errors); a < 0 clamped to 0\"" : "null");
      for (size_t j = 0; j < all.size(); j++) {
        const OpResult& r = all[j];
        std::fprintf(f, "    {\"op\": \"%s\", \"world\": %d, \"points\": [", op_name(r.op), world);
        for (size_t i = 0; i < r.points.size(); i++) {
          const Result& p = r.points[i];
          std::fprintf(f, "%s{\"bytes\": %.0f, \"median_ms\": %.5g, \"min_ms\": %.5g, \"max_ms\": %.5g, \"iters\": %zu}",
                       i ? ", " : "", p.bytes, p.median_ms, p.min_ms, p.max_ms, p.times.size());
        }
        std::fprintf(f, "],\n     \"fit\": ");
        const Fit& fi = r.fit;
        if (o.fit && fi.ok)
          std::fprintf(f,
                       "{\"a_s\": %s, \"b_s_per_byte\": %s, \"alpha_s\": %s, \"beta_s_per_byte\": %s, \"gbit_s\": %s, "
                       "\"max_rel_residual\": %s, \"a_clamped\": %s}",
                       json_num(fi.a_s).c_str(), json_num(fi.b_s_per_byte).c_str(), json_num(fi.alpha_s).c_str(),
                       json_num(fi.beta_s_per_byte).c_str(), json_num(fi.gbit_s).c_str(),
                       json_num(fi.max_rel_residual).c_str(), fi.a_clamped ? "true" : "false");
        else
          std::fprintf(f, "null");
        std::fprintf(f, "}%s\n", j + 1 < all.size() ? "," : "");
      }
      std::fprintf(f, "  ]\n}\n");
      if (std::fclose(f) != 0 || std::rename(tmp.c_str(), o.json.c_str()) != 0) {
        std::fprintf(stderr, "%s: error: cannot write '%s': %s\n", kProg, o.json.c_str(), std::strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
