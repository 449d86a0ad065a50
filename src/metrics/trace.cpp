#include "metrics/trace.h"

#include <nlohmann/json.hpp>

#include "metrics/metrics.h"

namespace llmpi {

void Tracer::span(const std::string& name, int tid, double start_ms, double end_ms, const std::string& args) {
  if (!enabled) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, tid, (start_ms - origin_ms) * 1e3, (end_ms - start_ms) * 1e3, args});
}

void Tracer::write(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  char buf[512];
  // Track names, so Perfetto shows "rank N" / "compute" / "communication".
  std::snprintf(buf, sizeof buf,
                "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n"
                "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
                "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"communication\"}}",
                rank, rank, rank, rank);
  out += buf;
  for (const Event& e : events_) {
    std::snprintf(buf, sizeof buf, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.1f,\"dur\":%.1f,\"name\":", rank,
                  e.tid, e.ts_us, e.dur_us);
    out += buf;
    out += nlohmann::json(e.name).dump();
    if (!e.args.empty()) out += ",\"args\":" + e.args;
    out += "}";
  }
  out += "\n]}\n";
  write_file_atomic(path, out);
}

}  // namespace llmpi
