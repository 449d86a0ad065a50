#include "params/param_table.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/rng.h"

namespace llmpi {

size_t aligned_copy_layout(const ParamTable& t, std::vector<size_t>* offsets) {
  offsets->assign(t.slices.size(), 0);
  size_t n = 0;
  for (size_t i = 0; i < t.slices.size(); i++) {
    const ParamSlice& s = t.slices[i];
    const bool same_tensor = i > 0 && t.slices[i - 1].layer == s.layer && t.slices[i - 1].role == s.role;
    if (!same_tensor) n = (n + 127) / 128 * 128;
    (*offsets)[i] = n;
    n += s.numel;
  }
  return n;
}

ParamSlice& ParamTable::add(ParamSlice s) {
  size_t n = 1;
  for (int d : s.shape) {
    if (d <= 0) fail("parameter '", s.name, "' has a non-positive dimension");
    if (n > SIZE_MAX / static_cast<size_t>(d))
      fail("parameter '", s.name, "' has more elements than a 64-bit count holds; choose a smaller model");
    n *= static_cast<size_t>(d);
  }
  if (numel > SIZE_MAX - n)
    fail("the parameter table reaches '", s.name, "' with more elements than a 64-bit count holds; choose a "
         "smaller model");
  if (!index_.emplace(s.name, slices.size()).second) fail("parameter '", s.name, "' appears twice in the table");
  s.offset = numel;
  s.numel = n;
  numel += n;
  slices.push_back(std::move(s));
  return slices.back();
}

const ParamSlice* ParamTable::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &slices[it->second];
}

const ParamSlice& ParamTable::at(const std::string& name) const {
  if (const ParamSlice* s = find(name)) return *s;
  fail("no parameter named '", name, "' in the model");
}

std::string param_table_json(const ParamTable& t) {
  nlohmann::json j = nlohmann::json::array();
  for (auto& s : t.slices) j.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}});
  return j.dump();
}

// FNV-1a of the name: the stream id of a tensor's initial values.
static uint64_t name_stream(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

size_t ParamSlice::whole_numel() const {
  if (!sharded()) return numel;
  size_t n = 1;
  for (int d : whole_shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {
// Calls f(whole_offset, shard_offset, count) for each contiguous run of a shard.
template <typename F>
void for_each_shard_run(const ParamSlice& s, F f) {
  if (!s.sharded()) return f(size_t(0), size_t(0), s.numel);
  const size_t inner = s.whole_shape.size() > 1 ? static_cast<size_t>(s.whole_shape[1]) : 1;
  size_t at = 0;
  if (s.split == 0) {
    for (const auto& r : s.ranges) {
      const size_t n = static_cast<size_t>(r.second - r.first) * inner;
      f(static_cast<size_t>(r.first) * inner, at, n);
      at += n;
    }
  } else {
    const size_t cols = static_cast<size_t>(s.ranges.at(0).second - s.ranges.at(0).first);
    for (int row = 0; row < s.whole_shape[0]; row++, at += cols)
      f(static_cast<size_t>(row) * inner + static_cast<size_t>(s.ranges[0].first), at, cols);
  }
  if (at != s.numel) fail("internal: the shard of ", s.name, " covers ", at, " values, not its ", s.numel);
}
}  // namespace

void take_shard(const ParamSlice& s, const float* whole, float* shard) {
  for_each_shard_run(s, [&](size_t w, size_t h, size_t n) { std::copy(whole + w, whole + w + n, shard + h); });
}

void put_shard(const ParamSlice& s, const float* shard, float* whole) {
  for_each_shard_run(s, [&](size_t w, size_t h, size_t n) { std::copy(shard + h, shard + h + n, whole + w); });
}

void init_param_values(const ParamTable& t, uint64_t seed, float* host) {
  for (const ParamSlice& s : t.slices) {
    float* w = host + s.offset;
    switch (s.init) {
      case InitKind::zeros:
        for (size_t k = 0; k < s.numel; k++) w[k] = 0.0f;
        break;
      case InitKind::ones:
        for (size_t k = 0; k < s.numel; k++) w[k] = 1.0f;
        break;
      case InitKind::normal: {
        Rng rng(seed, name_stream(s.name));
        if (!s.sharded()) {
          for (size_t k = 0; k < s.numel; k++) w[k] = static_cast<float>(s.init_std * rng.normal());
          break;
        }
        std::vector<float> whole(s.whole_numel());  // the whole tensor's stream, then this shard of it
        for (float& x : whole) x = static_cast<float>(s.init_std * rng.normal());
        take_shard(s, whole.data(), w);
        break;
      }
    }
  }
}

void GradReadyTracker::reset(const ParamTable& t) {
  table = &t;
  finished.assign(t.slices.size(), 0);
  next = 0;
  reported = 0;
}

size_t GradReadyTracker::advance() {
  while (next < finished.size() && finished[next]) next++;
  const size_t k = next == 0 ? 0 : table->end_of(next - 1);
  if (k > reported) {
    reported = k;
    return k;
  }
  return 0;
}

}  // namespace llmpi
