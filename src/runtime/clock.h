// Time: a monotonic wall clock in milliseconds, the median of measurements, a duration for
// people ("2m31s"), and the date and time now (UTC).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace llmpi {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v);         // 0 for an empty vector
std::string format_duration(double seconds);  // "2m31s", "1h04m", "45s"; "?" for a negative or NaN value
std::string utc_now(const char* strftime_format);  // the current UTC time, e.g. "%Y-%m-%dT%H:%M:%SZ"

}  // namespace llmpi
