#include "params/param_table.h"

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
    n *= static_cast<size_t>(d);
  }
  for (auto& o : slices)
    if (o.name == s.name) fail("parameter '", s.name, "' appears twice in the table");
  s.offset = numel;
  s.numel = n;
  numel += n;
  slices.push_back(std::move(s));
  return slices.back();
}

const ParamSlice* ParamTable::find(const std::string& name) const {
  for (auto& s : slices)
    if (s.name == name) return &s;
  return nullptr;
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
        for (size_t k = 0; k < s.numel; k++) w[k] = static_cast<float>(s.init_std * rng.normal());
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
