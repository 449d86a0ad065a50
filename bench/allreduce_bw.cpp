// bench-allreduce_bw: the bandwidth of a bare MPI_Allreduce(MPI_SUM, MPI_FLOAT), in place, for
// given message sizes: the yardstick that parallel.sync "allreduce" is compared against (same
// byte count, same ranks, same link, same MPI/UCX environment).
//
//   mpiexec -n 2 build/bench-allreduce_bw [--bytes N[,N...]] [--iters I] [--warmup W]
//                                        [--poll-us U] [--gap-ms G] [--scale] [--json OUT]
//
//   --bytes    message sizes in bytes, comma-separated (k/M suffixes = 1e3/1e6 bytes);
//              default 1048576,4194304,17094656 (17094656 = the reference model's fp32 gradient)
//   --iters    timed iterations per size (default 20); --warmup untimed ones first (default 3)
//   --poll-us  0 (default): blocking MPI_Allreduce. U > 0: MPI_Iallreduce polled with MPI_Test,
//              sleeping U microseconds between polls (what grad_sync does with parallel.poll_us)
//   --gap-ms   sleep G ms before each iteration (default 0): the idle time a training step leaves
//              between gradient all-reduces (TCP restarts slow start on a connection idle > RTO)
//   --scale    also multiply the result by 1/world inside the timed region, as grad_sync does
//   --json     write the results there (rank 0)
//
// Every iteration refills the buffer (untimed), meets at a barrier, then times one collective;
// the iteration's time is the slowest rank's. Reported per size: median/min/max ms,
// algbw = bytes / time and busbw = 2(n-1)/n x bytes / time (what each rank sends over its
// link in a bandwidth-optimal all-reduce; nccl-tests' convention), in GB/s and Gbit/s.
// The first warm-up result is checked (every element = sum of the ranks' values).
#include <mpi.h>

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

struct Options {
  std::vector<double> bytes{1048576, 4194304, 17094656};
  int iters = 20;
  int warmup = 3;
  int poll_us = 0;
  int gap_ms = 0;
  bool scale = false;
  std::string json;
};

[[noreturn]] void usage_error(int rank, const std::string& msg) {
  if (rank == 0)
    std::fprintf(stderr,
                 "%s: error: %s\nusage: %s [--bytes N[,N...]] [--iters I] [--warmup W] [--poll-us U] "
                 "[--gap-ms G] [--scale] [--json OUT]\n",
                 kProg, msg.c_str(), kProg);
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
      std::string list = value();
      size_t p = 0;
      while (p <= list.size()) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        o.bytes.push_back(parse_size(list.substr(p, q - p), rank));
        p = q + 1;
      }
    } else if (a == "--iters") o.iters = parse_int("--iters", value(), 1, rank);
    else if (a == "--warmup") o.warmup = parse_int("--warmup", value(), 1, rank);
    else if (a == "--poll-us") o.poll_us = parse_int("--poll-us", value(), 0, rank);
    else if (a == "--gap-ms") o.gap_ms = parse_int("--gap-ms", value(), 0, rank);
    else if (a == "--scale") o.scale = true;
    else if (a == "--json") o.json = value();
    else if (a == "-h" || a == "--help") {
      if (rank == 0) std::printf("usage: %s [--bytes N[,N...]] [--iters I] [--warmup W] [--poll-us U] [--gap-ms G] [--scale] [--json OUT]\n", kProg);
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

struct Result {
  double bytes, median_ms, min_ms, max_ms;
  std::vector<double> times;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const Options o = parse(argc, argv, rank);

  std::vector<Result> results;
  for (double bytes : o.bytes) {
    const int count = (int)(bytes / sizeof(float));
    std::vector<float> buf((size_t)count);
    std::vector<double> times;
    for (int it = 0; it < o.warmup + o.iters; it++) {
      std::fill(buf.begin(), buf.end(), (float)(rank + 1));
      if (o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_ms();
      if (o.poll_us > 0) {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        int done = 0;
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        while (!done) {
          std::this_thread::sleep_for(std::chrono::microseconds(o.poll_us));
          MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        }
      } else {
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      if (o.scale) {
        const float inv = 1.0f / (float)world;
        for (int i = 0; i < count; i++) buf[(size_t)i] *= inv;
      }
      double dt = now_ms() - t0, slowest = 0;
      MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it == 0) {
        const float want = (float)world * (world + 1) / 2 / (o.scale ? (float)world : 1.0f);
        long bad = 0;
        for (int i = 0; i < count; i++) bad += buf[(size_t)i] != want;
        long bad_all = 0;
        MPI_Allreduce(&bad, &bad_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (bad_all) {
          if (rank == 0) std::fprintf(stderr, "%s: error: wrong all-reduce result in %ld elements\n", kProg, bad_all);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      if (it >= o.warmup) times.push_back(slowest);
    }
    results.push_back({(double)count * sizeof(float), median(times), *std::min_element(times.begin(), times.end()),
                       *std::max_element(times.begin(), times.end()), times});
  }

  if (rank == 0) {
    const double bus = world > 1 ? 2.0 * (world - 1) / world : 0;
    std::printf("MPI_Allreduce(MPI_SUM, float, in place)%s, %d ranks, %s, %d iterations%s (median of slowest rank)\n",
                o.scale ? " + scale by 1/world" : "", world, o.poll_us > 0 ? ("MPI_Iallreduce + MPI_Test every " + std::to_string(o.poll_us) + " us").c_str()
                                     : "blocking",
                o.iters, o.gap_ms > 0 ? (", " + std::to_string(o.gap_ms) + " ms idle before each").c_str() : "");
    std::printf("%14s %10s %10s %10s %12s %12s %12s\n", "bytes", "median_ms", "min_ms", "max_ms", "algbw_GB/s",
                "busbw_GB/s", "busbw_Gbit/s");
    for (const Result& r : results) {
      const double alg = r.bytes / (r.median_ms * 1e6);
      std::printf("%14.0f %10.3f %10.3f %10.3f %12.3f %12.3f %12.3f\n", r.bytes, r.median_ms, r.min_ms, r.max_ms, alg,
                  alg * bus, alg * bus * 8);
    }
    if (!o.json.empty()) {
      FILE* f = std::fopen(o.json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "%s: error: cannot write '%s': %s\n", kProg, o.json.c_str(), std::strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      char host[MPI_MAX_PROCESSOR_NAME] = {0};
      int len = 0;
      MPI_Get_processor_name(host, &len);
      std::fprintf(f, "{\n  \"benchmark\": \"allreduce_bw\",\n  \"ranks\": %d,\n  \"mode\": %s,\n  \"poll_us\": %d,\n  \"gap_ms\": %d,\n  \"scale\": %s,\n",
                   world, o.poll_us > 0 ? "\"iallreduce+test\"" : "\"allreduce\"", o.poll_us, o.gap_ms,
                   o.scale ? "true" : "false");
      std::fprintf(f, "  \"iters\": %d,\n  \"warmup\": %d,\n  \"host\": %s,\n", o.iters, o.warmup, json_str(host).c_str());
      std::fprintf(f, "  \"env\": {");
      const char* keys[] = {"UCX_TLS", "UCX_NET_DEVICES", "UCX_RNDV_THRESH", "MPIR_CVAR_NOLOCAL"};
      for (int k = 0; k < 4; k++)
        std::fprintf(f, "%s%s: %s", k ? ", " : "", json_str(keys[k]).c_str(),
                     std::getenv(keys[k]) ? json_str(std::getenv(keys[k])).c_str() : "null");
      std::fprintf(f, "},\n  \"results\": [\n");
      for (size_t i = 0; i < results.size(); i++) {
        const Result& r = results[i];
        const double alg = r.bytes / (r.median_ms * 1e6);
        std::fprintf(f,
                     "    {\"bytes\": %.0f, \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
                     "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"busbw_Gbps\": %.4f, \"times_ms\": [",
                     r.bytes, r.median_ms, r.min_ms, r.max_ms, alg, alg * bus, alg * bus * 8);
        for (size_t k = 0; k < r.times.size(); k++) std::fprintf(f, "%s%.4f", k ? ", " : "", r.times[k]);
        std::fprintf(f, "]}%s\n", i + 1 < results.size() ? "," : "");
      }
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
    }
  }
  MPI_Finalize();
  return 0;
}
