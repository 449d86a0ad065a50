#include "runtime/clock.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace llmpi {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  long t = (long)(s + 0.5);
  char buf[64];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string utc_now(const char* fmt) {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

}  // namespace llmpi
