// Per-rank Chrome trace (trace-rank{N}.json; open in Perfetto or chrome://tracing): complete
// events ("ph":"X") on one track per thread — tid 0 the compute thread (data, forward, backward,
// gradient wait, optimizer), tid 1 the communication thread (one span per bucket collective).
// Thread-safe; records only while enabled (the first runtime.trace_steps steps).
#pragma once
#include <mutex>
#include <string>
#include <vector>

namespace llmpi {

struct Tracer {
  bool enabled = false;
  int rank = 0;
  double origin_ms = 0;  // now_ms() at the start of the run

  void span(const std::string& name, int tid, double start_ms, double end_ms, const std::string& args_json = "");
  void write(const std::string& path) const;  // atomically; throws Error naming the path

 private:
  struct Event {
    std::string name;
    int tid;
    double ts_us, dur_us;
    std::string args;
  };
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace llmpi
