#include "checkpoint/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "data/h5_util.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace llmpi {

using h5::Id;

namespace {

constexpr const char* kFormat = "llmpi-checkpoint";
constexpr int kVersion = 2;  // 1: before model families (gpt2 only); still read

std::string describe(const std::string& path) { return "checkpoint '" + path + "'"; }
const char* const kRemedy = "resume from another checkpoint (see the run's checkpoints/ folder) or start afresh";

void write_rows(hid_t file, const char* name, const std::vector<float>& data, hsize_t rows, hsize_t n,
                const std::string& path) {
  hsize_t dims[2] = {rows, n};
  Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  Id dset(H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!dset.valid() || H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
    fail("cannot write '", name, "' to ", describe(path), h5::detail(),
         " (disk full?); the previous checkpoint is untouched: free space or choose another run.dir");
}

int64_t require_int(hid_t f, const char* name, const std::string& path) {
  int64_t v = 0;
  if (!h5::read_int_attr(f, name, v, describe(path), kRemedy))
    fail(describe(path), " has no '", name, "' attribute: it is not an llmpi checkpoint");
  return v;
}

std::string require_string(hid_t f, const char* name, const std::string& path) {
  std::string v;
  if (!h5::read_string_attr(f, name, v, describe(path), kRemedy))
    fail(describe(path), " has no '", name, "' attribute: it is not an llmpi checkpoint");
  return v;
}

Id open_file(const std::string& path) {
  h5::quiet();
  FILE* probe = std::fopen(path.c_str(), "rb");
  if (!probe) fail("checkpoint '", path, "' does not exist or cannot be read; check the path given to --resume");
  std::fclose(probe);
  if (!h5::has_signature(path)) fail("'", path, "' is not an HDF5 file, so not an llmpi checkpoint");
  Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) fail(describe(path), " is damaged or truncated", h5::detail(), "; ", kRemedy);
  return f;
}

}  // namespace

void write_checkpoint(const std::string& path, const CheckpointData& d) {
  h5::quiet();
  const CheckpointInfo& i = d.info;
  const std::string tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  {
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid())
      fail("cannot create ", describe(tmp), h5::detail(),
           ": check that the checkpoint directory is writable and has space; the previous checkpoint is untouched");
    const std::string w = describe(tmp);
    h5::write_string_attr(file, "format", kFormat, w);
    h5::write_int_attr(file, "version", kVersion, w);
    h5::write_int_attr(file, "step", i.step, w);
    h5::write_int_attr(file, "optimizer_t", i.optimizer_t, w);
    h5::write_string_attr(file, "optimizer", i.optimizer, w);
    h5::write_string_attr(file, "sync", i.sync, w);
    h5::write_int_attr(file, "world_size", i.world_size, w);
    h5::write_int_attr(file, "seed", (int64_t)i.seed, w);
    h5::write_string_attr(file, "family", family_name(i.desc.family), w);
    h5::write_string_attr(file, "model", model_desc_json(i.desc).dump(), w);
    h5::write_int_attr(file, "n_layer", i.desc.n_layer, w);
    h5::write_int_attr(file, "n_head", i.desc.n_head, w);
    h5::write_int_attr(file, "d_model", i.desc.d_model, w);
    h5::write_int_attr(file, "seq_len", i.desc.max_seq_len, w);
    h5::write_int_attr(file, "vocab_size", i.desc.vocab_size, w);
    h5::write_string_attr(file, "config", i.config_json, w);
    h5::write_string_attr(file, "param_table", i.param_table_json, w);
    write_rows(file, "params", d.params, i.rows, i.n, tmp);
    if (i.optimizer == "adamw") {
      write_rows(file, "adam_m", d.m, i.rows, i.n, tmp);
      write_rows(file, "adam_v", d.v, i.rows, i.n, tmp);
    }
    if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0 || file.reset() < 0)
      fail("cannot finish ", describe(tmp), h5::detail(),
           " (disk full?); the previous checkpoint is untouched: free space or choose another run.dir");
  }
  h5::commit_tmp_file(tmp, path, guard);
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  Id f = open_file(path);
  CheckpointInfo i;
  i.path = path;
  std::string format;
  if (!h5::read_string_attr(f, "format", format, describe(path), kRemedy) || format != kFormat)
    fail("'", path, "' is not an llmpi checkpoint (format '", format, "')");
  int64_t version = require_int(f, "version", path);
  if (version != 1 && version != kVersion)
    fail(describe(path), " has version ", version, ", but this llmpi reads versions 1 and ", kVersion,
         ": use the llmpi release that wrote it");
  i.version = (int)version;
  i.step = require_int(f, "step", path);
  i.optimizer_t = require_int(f, "optimizer_t", path);
  i.optimizer = require_string(f, "optimizer", path);
  i.sync = require_string(f, "sync", path);
  i.world_size = require_int(f, "world_size", path);
  i.seed = (uint64_t)require_int(f, "seed", path);
  if (version >= 2) {
    const std::string family = require_string(f, "family", path);
    auto j = nlohmann::json::parse(require_string(f, "model", path), nullptr, false);
    if (j.is_discarded()) fail(describe(path), ": its 'model' attribute is not JSON; ", kRemedy);
    try {
      i.desc = model_desc_from_json(j);
    } catch (const Error& e) {
      fail(describe(path), ": ", e.what(), "; ", kRemedy);
    }
    if (family_name(i.desc.family) != family)
      fail(describe(path), ": its 'family' attribute (", family, ") disagrees with its model description; ", kRemedy);
  } else {
    // Version 1: a gpt2 model with the defaults of its time (LayerNorm eps 1e-5, MLP 4 d_model,
    // tied head, positions = seq_len).
    ModelConfig m{};
    m.family = "gpt2";
    m.n_layer = (int)require_int(f, "n_layer", path);
    m.n_head = (int)require_int(f, "n_head", path);
    m.d_model = (int)require_int(f, "d_model", path);
    m.seq_len = (int)require_int(f, "seq_len", path);
    m.init_std = 0.02;
    m.norm_eps = 1e-5;
    m.tie_embeddings = true;
    i.desc = model_desc_from_config(m, (int)require_int(f, "vocab_size", path));
  }
  i.config_json = require_string(f, "config", path);
  i.param_table_json = require_string(f, "param_table", path);
  Id dset(H5Dopen2(f, "params", H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail(describe(path), " has no 'params' dataset", h5::detail(), "; ", kRemedy);
  Id space(H5Dget_space(dset), H5Sclose);
  hsize_t dims[2] = {0, 0};
  if (H5Sget_simple_extent_ndims(space) != 2 || H5Sget_simple_extent_dims(space, dims, nullptr) < 0)
    fail(describe(path), ": 'params' must be 2-D [rows, n]; ", kRemedy);
  i.rows = (int64_t)dims[0];
  i.n = (size_t)dims[1];
  return i;
}

void read_checkpoint_row(const CheckpointInfo& info, int64_t row, float* params, float* m, float* v) {
  Id f = open_file(info.path);
  auto read = [&](const char* name, float* out) {
    Id dset(H5Dopen2(f, name, H5P_DEFAULT), H5Dclose);
    if (!dset.valid()) fail(describe(info.path), " has no '", name, "' dataset", h5::detail(), "; ", kRemedy);
    Id fspace(H5Dget_space(dset), H5Sclose);
    hsize_t start[2] = {(hsize_t)row, 0}, count[2] = {1, (hsize_t)info.n};
    Id mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
        H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out) < 0)
      fail("cannot read '", name, "' row ", row, " from ", describe(info.path), h5::detail(), "; ", kRemedy);
  };
  read("params", params);
  if (m) read("adam_m", m);
  if (v) read("adam_v", v);
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "/step-%08lld.h5", (long long)step);
  return dir + name;
}

// Steps of the checkpoints in dir, ascending.
static std::vector<int64_t> checkpoint_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  DIR* d = opendir(dir.c_str());
  if (!d) return steps;
  while (dirent* e = readdir(d)) {
    long long s = 0;
    char tail[8] = {0};
    if (std::sscanf(e->d_name, "step-%lld.%7s", &s, tail) == 2 && std::string(tail) == "h5") steps.push_back(s);
  }
  closedir(d);
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string latest_checkpoint(const std::string& dir) {
  auto steps = checkpoint_steps(dir);
  return steps.empty() ? "" : checkpoint_path(dir, steps.back());
}

void prune_checkpoints(const std::string& dir, int keep) {
  auto steps = checkpoint_steps(dir);
  for (size_t i = 0; i + (size_t)std::max(keep, 1) < steps.size(); i++)
    std::remove(checkpoint_path(dir, steps[i]).c_str());
}

}  // namespace llmpi
