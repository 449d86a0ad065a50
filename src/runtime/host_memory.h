// What the host has: memory still available to this process, its peak resident set, and byte
// counts for people.
#pragma once
#include <string>

namespace llmpi {

// Host memory this process may still use: MemAvailable (/proc/meminfo), lowered to what the
// memory cgroup (v2 memory.max − memory.current, or v1 limit − usage) leaves. `source` says which.
double host_memory_available(std::string* source = nullptr);

// This process's peak resident set (VmHWM of /proc/self/status) in bytes; -1 when unknown.
double peak_rss_bytes();

// "1.5 GB", "350 MB"
std::string format_bytes(double bytes);

}  // namespace llmpi
