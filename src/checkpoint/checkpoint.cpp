#include "checkpoint/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/crc32c.h"
#include "checkpoint/sharded.h"
#include "data/h5_util.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace llmpi {

using h5::Id;

namespace {

constexpr const char* kFormat = "llmpi-checkpoint";
constexpr int kVersion = 2;         // what write_checkpoint writes; 1 (before model families, gpt2 only) is read

std::string describe(const std::string& path) { return "checkpoint '" + path + "'"; }
const char* const kRemedy = "resume from another checkpoint (see the run's checkpoints/ folder) or start afresh";

// Every row of a dataset is checksummed in blocks of this many values (4 MB of float32): the
// dataset's attribute `crc32c` holds rows x ceil(n / block) CRC-32C values (row-major) of the
// float32 little-endian bytes, and `crc32c_block` the block size. Computed from the data being
// written; verified by every read.
constexpr hsize_t kCrcBlock = hsize_t(1) << 20;

void write_rows(hid_t file, const char* name, const std::vector<float>& data, hsize_t rows, hsize_t n,
                const std::string& path) {
  hsize_t dims[2] = {rows, n};
  Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  Id dset(H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!dset.valid() || H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
    fail("cannot write '", name, "' to ", describe(path), h5::detail(),
         " (disk full?); the previous checkpoint is untouched: free space or choose another run.dir");
  const hsize_t blocks = (n + kCrcBlock - 1) / kCrcBlock;
  std::vector<uint32_t> crc(rows * blocks);
  for (hsize_t r = 0; r < rows; r++)
    for (hsize_t b = 0; b < blocks; b++) {
      const hsize_t off = b * kCrcBlock, len = std::min(kCrcBlock, n - off);
      crc[r * blocks + b] = crc32c(data.data() + r * n + off, len * sizeof(float));
    }
  const hsize_t count = crc.size();
  Id aspace(H5Screate_simple(1, &count, nullptr), H5Sclose);
  Id attr(H5Acreate2(dset, "crc32c", H5T_STD_U32LE, aspace, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr, H5T_NATIVE_UINT32, crc.data()) < 0)
    fail("cannot write the checksums of '", name, "' to ", describe(path), h5::detail(),
         " (disk full?); the previous checkpoint is untouched: free space or choose another run.dir");
  h5::write_int_attr(dset, "crc32c_block", int64_t(kCrcBlock), describe(path));
}

// The block checksums of a dataset (empty when it has none: an older file).
std::vector<uint32_t> read_crcs(hid_t dset, const CheckpointInfo& info, const char* name, hsize_t& block) {
  std::vector<uint32_t> crc;
  if (H5Aexists(dset, "crc32c") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return crc;
  }
  int64_t b = 0;
  Id attr(H5Aopen(dset, "crc32c", H5P_DEFAULT), H5Aclose);
  Id space(H5Aget_space(attr), H5Sclose);
  const hssize_t count = space.valid() ? H5Sget_simple_extent_npoints(space) : -1;
  if (!h5::read_int_attr(dset, "crc32c_block", b, describe(info.path), kRemedy) || b <= 0 || count < 0)
    throw CheckpointDamaged(describe(info.path) + ": the checksums of '" + name + "' are unreadable; " + kRemedy);
  block = hsize_t(b);
  const hsize_t want = hsize_t(info.rows) * ((info.n + block - 1) / block);
  crc.resize(size_t(count));
  if (hsize_t(count) != want || H5Aread(attr, H5T_NATIVE_UINT32, crc.data()) < 0)
    throw CheckpointDamaged(describe(info.path) + ": the checksums of '" + name + "' are unreadable" + h5::detail() +
                            "; " + kRemedy);
  return crc;
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

}  // namespace

Id open_checkpoint_file(const std::string& path) {
  h5::quiet();
  FILE* probe = std::fopen(path.c_str(), "rb");
  if (!probe) fail("checkpoint '", path, "' does not exist or cannot be read; check the path given to --resume");
  std::fclose(probe);
  if (!h5::has_signature(path))
    throw CheckpointDamaged("'" + path + "' is not an HDF5 file, so not an llmpi checkpoint (damaged?); " + kRemedy);
  Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) throw CheckpointDamaged(describe(path) + " is damaged or truncated" + h5::detail() + "; " + kRemedy);
  return f;
}

namespace {

// Read row `row` of dataset `name` into out[0, n), block by block, checking each block's CRC-32C,
// so a mismatch names the elements it covers.
void read_row(hid_t f, const CheckpointInfo& info, const char* name, int64_t row, float* out) {
  Id dset(H5Dopen2(f, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid())
    throw CheckpointDamaged(describe(info.path) + " has no '" + name + "' dataset" + h5::detail() + "; " + kRemedy);
  hsize_t block = kCrcBlock;
  const std::vector<uint32_t> crc = read_crcs(dset, info, name, block);
  Id fspace(H5Dget_space(dset), H5Sclose);
  const hsize_t n = info.n, blocks = (n + block - 1) / block;
  for (hsize_t b = 0; b < blocks; b++) {
    const hsize_t off = b * block;
    hsize_t start[2] = {(hsize_t)row, off}, count[2] = {1, std::min(block, n - off)};
    const std::string where = " in row " + std::to_string(row) + ", elements [" + std::to_string(off) + ", " +
                              std::to_string(off + count[1]) + ")";
    Id mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
        H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out + off) < 0)
      throw CheckpointDamaged(describe(info.path) + ": dataset '" + name + "' cannot be read" + where +
                              h5::detail() + ": the file is damaged; " + kRemedy +
                              " (--resume auto skips damaged checkpoints)");
    if (crc.empty()) continue;  // an older file: nothing to verify against
    const uint32_t want = crc[size_t(row) * blocks + b], got = crc32c(out + off, count[1] * sizeof(float));
    if (got != want) {
      char sums[64];
      std::snprintf(sums, sizeof sums, " (CRC-32C %08x, stored %08x)", got, want);
      throw CheckpointDamaged(describe(info.path) + ": dataset '" + name + "' fails its checksum" + where + sums +
                              ": the file is damaged; " + kRemedy + " (--resume auto skips damaged checkpoints)");
    }
  }
}

}  // namespace

void write_checkpoint_attributes(hid_t file, const CheckpointInfo& i, int version, const std::string& w) {
  h5::write_string_attr(file, "format", kFormat, w);
  h5::write_int_attr(file, "version", version, w);
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
  if (!i.data_json.empty()) h5::write_string_attr(file, "data", i.data_json, w);
  if (!i.lineage.empty()) h5::write_string_attr(file, "lineage", i.lineage, w);
}

void write_checkpoint(const std::string& path, const CheckpointData& d) {
  h5::quiet();
  const CheckpointInfo& i = d.info;
  const std::string tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  {
    // HDF5 1.8 formats at least: superblock and object headers (the attributes) carry checksums.
    Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (!fapl.valid() || H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
      fail("cannot set up ", describe(tmp), h5::detail());
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    if (!file.valid())
      fail("cannot create ", describe(tmp), h5::detail(),
           ": check that the checkpoint directory is writable and has space; the previous checkpoint is untouched");
    const uint64_t data_bytes = uint64_t(i.rows) * i.n * sizeof(float) * (i.optimizer == "adamw" ? 3 : 1);
    h5::reserve_space(file, data_bytes + i.config_json.size() + i.param_table_json.size() + (1u << 20), path,
                      describe(tmp), "the previous checkpoint is untouched: free space or choose another run.dir");
    write_checkpoint_attributes(file, i, kVersion, describe(tmp));
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

static CheckpointInfo read_info(const std::string& path, bool& wrong_version);

CheckpointInfo read_checkpoint_info(const std::string& path) {
  bool wrong_version = false;
  try {
    return read_info(path, wrong_version);
  } catch (const CheckpointDamaged&) {
    throw;
  } catch (const Error& e) {
    if (wrong_version) throw;
    throw CheckpointDamaged(e.what());  // whatever else stops it from reading: the file is unusable
  }
}

static CheckpointInfo read_info(const std::string& path, bool& wrong_version) {
  Id f = open_checkpoint_file(path);
  CheckpointInfo i;
  i.path = path;
  std::string format;
  if (!h5::read_string_attr(f, "format", format, describe(path), kRemedy) || format != kFormat)
    fail("'", path, "' is not an llmpi checkpoint (format '", format, "')");
  int64_t version = require_int(f, "version", path);
  wrong_version = version < 1 || version > kShardedVersion;
  if (wrong_version)
    fail(describe(path), " has version ", version, ", but this llmpi reads versions 1 to ", kShardedVersion,
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
    m.family = Family::gpt2;
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
  h5::read_string_attr(f, "data", i.data_json, describe(path), kRemedy);  // absent in older files
  h5::read_string_attr(f, "lineage", i.lineage, describe(path), kRemedy);  // absent in older files
  if (version >= kShardedVersion) {  // a dataset per tensor (checkpoint/sharded.h), always checksummed
    i.rows = require_int(f, "replicas", path);
    if (i.rows < 1) fail(describe(path), ": its 'replicas' attribute is ", i.rows, "; ", kRemedy);
    i.n = param_table_from_json(i.param_table_json, path).numel;
    i.checksummed = true;
    return i;
  }
  Id dset(H5Dopen2(f, "params", H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail(describe(path), " has no 'params' dataset", h5::detail(), "; ", kRemedy);
  i.checksummed = H5Aexists(dset, "crc32c") > 0;
  H5Eclear2(H5E_DEFAULT);
  Id space(H5Dget_space(dset), H5Sclose);
  hsize_t dims[2] = {0, 0};
  if (H5Sget_simple_extent_ndims(space) != 2 || H5Sget_simple_extent_dims(space, dims, nullptr) < 0)
    fail(describe(path), ": 'params' must be 2-D [rows, n]; ", kRemedy);
  i.rows = (int64_t)dims[0];
  i.n = (size_t)dims[1];
  return i;
}

void read_checkpoint_row(const CheckpointInfo& info, int64_t row, float* params, float* m, float* v) {
  if (info.version >= kShardedVersion) {  // every tensor whole into its place of the row, verified first
    const CheckpointReader reader(info);
    reader.verify_share(m || v ? 3 : 1, 0, 1);
    float* out[3] = {params, m, v};
    for (int g = 0; g < 3; g++) {
      if (!out[g]) continue;
      for (size_t t = 0; t < reader.whole.slices.size(); t++) {
        const ParamSlice& s = reader.whole.slices[t];
        const auto [R, C] = rows_cols(s.shape);
        reader.read(g, t, row, TensorRect{0, R, 0, C}, out[g] + s.offset);
      }
    }
    return;
  }
  Id f = open_checkpoint_file(info.path);
  read_row(f, info, "params", row, params);
  if (m) read_row(f, info, "adam_m", row, m);
  if (v) read_row(f, info, "adam_v", row, v);
}

void verify_checkpoint(const CheckpointInfo& info) {
  if (info.version >= kShardedVersion) return CheckpointReader(info).verify_share(info.optimizer == "adamw" ? 3 : 1, 0, 1);
  Id f = open_checkpoint_file(info.path);
  std::vector<float> scratch(info.n);
  for (const char* name : {"params", "adam_m", "adam_v"}) {
    if (std::string(name) != "params" && info.optimizer != "adamw") continue;
    for (int64_t row = 0; row < info.rows; row++) read_row(f, info, name, row, scratch.data());
  }
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

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  auto steps = checkpoint_steps(dir);
  std::vector<std::string> paths;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) paths.push_back(checkpoint_path(dir, *it));
  return paths;
}

void prune_checkpoints(const std::string& dir, int keep, const std::string& lineage) {
  std::vector<int64_t> mine;  // steps of this lineage's checkpoints, ascending
  for (int64_t s : checkpoint_steps(dir)) {
    try {
      if (!lineage.empty() && read_checkpoint_info(checkpoint_path(dir, s)).lineage == lineage) mine.push_back(s);
    } catch (const Error&) {  // unreadable: not ours to delete
    }
  }
  for (size_t i = 0; i + (size_t)std::max(keep, 1) < mine.size(); i++)
    std::remove(checkpoint_path(dir, mine[i]).c_str());
}

}  // namespace llmpi
