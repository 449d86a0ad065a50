#include "checkpoint/sharded.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runtime/crc32c.h"
#include "runtime/error.h"
#include "runtime/mpi_env.h"

namespace llmpi {

using h5::Id;

namespace {

const char* const kRemedy = "resume from another checkpoint (see the run's checkpoints/ folder) or start afresh";
std::string describe(const std::string& path) { return "checkpoint '" + path + "'"; }

// The attribute with the rectangles' checksums: k rows of (replica, row0, rows, col0, cols, crc).
constexpr const char* kRectAttr = "crc32c_rects";
constexpr int kRectFields = 6;
// What rank 0 gathers of one rectangle: (group, tensor) then the attribute's six fields.
constexpr int kRecordFields = 2 + kRectFields;

std::string dataset_name(int group, const std::string& tensor) {
  return std::string(state_group_name(group)) + "/" + tensor;
}

std::string rect_text(const TensorRect& r) {
  return "rows [" + std::to_string(r.row0) + ", " + std::to_string(r.row0 + r.rows) + "), columns [" +
         std::to_string(r.col0) + ", " + std::to_string(r.col0 + r.cols) + ")";
}

// The dataset's dimensions: the tensor's shape, after the replica index when there are several.
std::vector<hsize_t> dataset_dims(const ParamSlice& s, int64_t replicas) {
  std::vector<hsize_t> dims;
  if (replicas > 1) dims.push_back((hsize_t)replicas);
  for (int d : s.shape) dims.push_back((hsize_t)d);
  return dims;
}

// Selects rectangle r of replica `replica` in a version-3 dataset's space.
void select_rect(hid_t space, const ParamSlice& s, int64_t replicas, int64_t replica, const TensorRect& r) {
  std::vector<hsize_t> start, count;
  if (replicas > 1) start.push_back((hsize_t)replica), count.push_back(1);
  start.push_back((hsize_t)r.row0), count.push_back((hsize_t)r.rows);
  if (s.shape.size() > 1) start.push_back((hsize_t)r.col0), count.push_back((hsize_t)r.cols);
  if (H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
    fail("internal: cannot select ", rect_text(r), " of ", s.name, h5::detail());
}

void fail_damaged(const CheckpointInfo& info, const std::string& what) {
  throw CheckpointDamaged(describe(info.path) + ": " + what + ": the file is damaged; " + kRemedy +
                          " (--resume auto skips damaged checkpoints)");
}

}  // namespace

const char* state_group_name(int group) {
  static const char* const names[] = {"params", "adam_m", "adam_v"};
  return names[group];
}

std::pair<int64_t, int64_t> rows_cols(const std::vector<int>& shape) {
  if (shape.empty()) return {1, 1};
  int64_t rest = 1;
  for (size_t d = 1; d < shape.size(); d++) rest *= shape[d];
  return {shape[0], rest};
}

std::vector<TensorRect> slice_rects(const ParamSlice& s, size_t lo, size_t hi) {
  const auto [R, C] = rows_cols(s.sharded() ? s.whole_shape : s.shape);
  (void)R;
  // The slice's own values as [local rows, lc]: a column shard's width, else the tensor's.
  const int64_t lc = s.sharded() && s.split == 1 ? s.ranges.at(0).second - s.ranges.at(0).first : C;
  std::vector<TensorRect> local;
  for (int64_t a = (int64_t)lo, b = (int64_t)hi; a < b;) {
    const int64_t row = a / lc, col = a % lc;
    if (col != 0 || b - a < lc) {  // part of one row
      const int64_t n = std::min(lc - col, b - a);
      local.push_back({row, 1, col, n});
      a += n;
    } else {  // whole rows
      const int64_t rows = (b - a) / lc;
      local.push_back({row, rows, 0, lc});
      a += rows * lc;
    }
  }
  if (!s.sharded()) return local;
  std::vector<TensorRect> out;
  if (s.split == 1) {
    for (TensorRect r : local) out.push_back({r.row0, r.rows, r.col0 + s.ranges[0].first, r.cols});
    return out;
  }
  // Row shards: local row k is the k-th row of the ranges, concatenated in order.
  for (const TensorRect& r : local) {
    int64_t k = r.row0, left = r.rows, before = 0;
    for (const auto& [b, e] : s.ranges) {
      const int64_t len = e - b;
      if (left > 0 && k < before + len) {
        const int64_t n = std::min(left, before + len - k);
        out.push_back({b + (k - before), n, r.col0, r.cols});
        k += n, left -= n;
      }
      before += len;
    }
    if (left != 0) fail("internal: rows of ", s.name, " beyond its shard's ranges");
  }
  return out;
}

void rect_crcs(std::vector<RectWrite>& writes) {
  for (RectWrite& w : writes) w.crc = crc32c(w.data, (size_t)w.rect.numel() * sizeof(float));
}

ParamTable param_table_from_json(const std::string& json, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_array()) fail(describe(path), ": its 'param_table' attribute is not a JSON list; ", kRemedy);
  ParamTable t;
  for (const nlohmann::json& e : j) {
    if (!e.is_object() || !e.contains("name") || !e.contains("shape") || !e.contains("offset"))
      fail(describe(path), ": an entry of its 'param_table' lacks name, shape or offset; ", kRemedy);
    ParamSlice s;
    s.name = e["name"].get<std::string>();
    s.shape = e["shape"].get<std::vector<int>>();
    const ParamSlice& added = t.add(s);
    if (added.offset != e["offset"].get<size_t>())
      fail(describe(path), ": its 'param_table' places ", s.name, " at ", e["offset"].get<size_t>(), ", not at ",
           added.offset, " after the tensors before it; ", kRemedy);
  }
  return t;
}

// ---- writing --------------------------------------------------------------------------------------

std::vector<uint64_t> create_sharded_file(MPI_Comm comm, const std::string& tmp, const CheckpointInfo& info,
                                          const ParamTable& whole, int groups, const std::vector<RectWrite>& mine) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const size_t T = whole.slices.size();
  // Every rank's rectangles (without their values) to rank 0.
  std::vector<int64_t> records;
  records.reserve(mine.size() * kRecordFields);
  for (const RectWrite& w : mine)
    for (int64_t x : {(int64_t)w.group, (int64_t)w.tensor, w.replica, w.rect.row0, w.rect.rows, w.rect.col0,
                      w.rect.cols, (int64_t)w.crc})
      records.push_back(x);
  // (every rank learns every count, so that a total MPI's int cannot hold fails on every rank)
  const int64_t n64 = (int64_t)records.size();
  std::vector<int64_t> counts64(world);
  MPI_Allgather(&n64, 1, MPI_INT64_T, counts64.data(), 1, MPI_INT64_T, comm);
  int64_t total = 0;
  std::vector<int> counts(world), displs(world, 0);
  for (int r = 0; r < world; r++) displs[r] = (int)std::min<int64_t>(total, INT32_MAX), counts[r] = (int)counts64[r],
                                  total += counts64[r];
  if (total > INT32_MAX)
    fail("a checkpoint of ", total / kRecordFields, " rectangles is more than one gather can carry; use fewer ranks "
         "per tensor (a smaller parallel.tp) or fewer tensors");
  const int n = (int)n64;
  std::vector<int64_t> all(rank == 0 ? (size_t)total : 0);
  MPI_Gatherv(records.data(), n, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, 0, comm);

  std::vector<uint64_t> offsets((size_t)groups * T, 0);
  std::string err;
  if (rank == 0) {
    try {
      // Each dataset's rectangles, checked to cover it exactly once.
      std::vector<std::vector<int64_t>> rects((size_t)groups * T);
      std::vector<int64_t> covered((size_t)groups * T, 0);
      for (size_t at = 0; at < all.size(); at += kRecordFields) {
        const int64_t g = all[at], t = all[at + 1];
        if (g < 0 || g >= groups || t < 0 || (size_t)t >= T) fail("internal: a checksum record names no dataset");
        const ParamSlice& s = whole.slices[(size_t)t];
        const auto [R, C] = rows_cols(s.shape);
        const TensorRect r{all[at + 3], all[at + 4], all[at + 5], all[at + 6]};
        if (all[at + 2] < 0 || all[at + 2] >= info.rows || r.row0 < 0 || r.col0 < 0 || r.rows <= 0 || r.cols <= 0 ||
            r.row0 + r.rows > R || r.col0 + r.cols > C)
          fail("internal: a rank writes ", rect_text(r), " outside ", dataset_name((int)g, s.name));
        std::vector<int64_t>& v = rects[(size_t)g * T + (size_t)t];
        v.insert(v.end(), all.begin() + (long)at + 2, all.begin() + (long)at + kRecordFields);
        covered[(size_t)g * T + (size_t)t] += r.numel();
      }
      for (int g = 0; g < groups; g++)
        for (size_t t = 0; t < T; t++)
          if (covered[(size_t)g * T + t] != info.rows * (int64_t)whole.slices[t].numel)
            fail("internal: the ranks write ", covered[(size_t)g * T + t], " values of ",
                 dataset_name(g, whole.slices[t].name), ", which has ", info.rows * (int64_t)whole.slices[t].numel,
                 ": the layout's owners do not cover it once");
      h5::quiet();
      const std::string w = describe(tmp);
      const char* const full = "(disk full?); the previous checkpoint is untouched: free space or choose another run.dir";
      Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
      if (!fapl.valid() || H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
        fail("cannot set up ", w, h5::detail());
      Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
      if (!file.valid())
        fail("cannot create ", w, h5::detail(),
             ": check that the checkpoint directory is writable and has space; the previous checkpoint is untouched");
      const uint64_t data_bytes = uint64_t(info.rows) * whole.numel * sizeof(float) * (uint64_t)groups;
      h5::reserve_space(file, data_bytes + info.config_json.size() + info.param_table_json.size() + (4u << 20) +
                                  all.size() * sizeof(int64_t),
                        tmp, w, "the previous checkpoint is untouched: free space or choose another run.dir");
      write_checkpoint_attributes(file, info, 3, w);
      h5::write_int_attr(file, "replicas", info.rows, w);
      // Contiguous, allocated now (their offsets are known before any value is written) and never
      // filled (every value is written by its owner).
      Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      if (!dcpl.valid() || H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 || H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
          H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)
        fail("cannot set up the datasets of ", w, h5::detail());
      for (int g = 0; g < groups; g++) {
        Id grp(H5Gcreate2(file, state_group_name(g), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
        if (!grp.valid()) fail("cannot create group '", state_group_name(g), "' in ", w, h5::detail(), " ", full);
        for (size_t t = 0; t < T; t++) {
          const ParamSlice& s = whole.slices[t];
          const std::vector<hsize_t> dims = dataset_dims(s, info.rows);
          Id space(H5Screate_simple((int)dims.size(), dims.data(), nullptr), H5Sclose);
          Id dset(H5Dcreate2(grp, s.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
          const haddr_t addr = dset.valid() ? H5Dget_offset(dset) : HADDR_UNDEF;
          if (addr == HADDR_UNDEF)
            fail("cannot create '", dataset_name(g, s.name), "' in ", w, h5::detail(), " ", full);
          offsets[(size_t)g * T + t] = (uint64_t)addr;
          const std::vector<int64_t>& v = rects[(size_t)g * T + t];
          const hsize_t adims[2] = {v.size() / kRectFields, kRectFields};
          Id aspace(H5Screate_simple(2, adims, nullptr), H5Sclose);
          Id attr(H5Acreate2(dset, kRectAttr, H5T_STD_I64LE, aspace, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
          if (!attr.valid() || H5Awrite(attr, H5T_NATIVE_INT64, v.data()) < 0)
            fail("cannot write the checksums of '", dataset_name(g, s.name), "' to ", w, h5::detail(), " ", full);
        }
      }
      if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0 || file.reset() < 0) fail("cannot finish ", w, h5::detail(), " ", full);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) {
    if (rank == 0) std::remove(tmp.c_str());
    fail(err);  // the same message on every rank
  }
  MPI_Bcast(offsets.data(), (int)offsets.size(), MPI_UINT64_T, 0, comm);  // (3 x the tensors: few)
  return offsets;
}

std::string write_rects(MPI_File fh, const ParamTable& whole, int64_t replicas, const std::vector<uint64_t>& offsets,
                        const std::vector<RectWrite>& writes, const std::string& tmp) {
  const size_t T = whole.slices.size();
  // One contiguous run of bytes, in pieces MPI's int count can hold.
  auto put = [&](uint64_t at, const float* data, uint64_t bytes) -> std::string {
    const char* p = reinterpret_cast<const char*>(data);
    while (bytes > 0) {
      const int n = (int)std::min<uint64_t>(bytes, uint64_t(1) << 30);
      MPI_Status st;
      const int rc = MPI_File_write_at(fh, (MPI_Offset)at, p, n, MPI_BYTE, &st);
      int written = 0;
      if (rc == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &written);
      if (rc != MPI_SUCCESS || written != n) {
        char text[MPI_MAX_ERROR_STRING] = "short write";
        int len = 0;
        if (rc != MPI_SUCCESS) MPI_Error_string(rc, text, &len);
        return "cannot write " + describe(tmp) + " (" + text + "; disk full?); the previous checkpoint is untouched: "
               "free space or choose another run.dir";
      }
      at += (uint64_t)n, p += n, bytes -= (uint64_t)n;
    }
    return "";
  };
  for (const RectWrite& w : writes) {
    const ParamSlice& s = whole.slices[(size_t)w.tensor];
    const auto [R, C] = rows_cols(s.shape);
    const uint64_t base = offsets[(size_t)w.group * T + (size_t)w.tensor] + uint64_t(w.replica) * R * C * sizeof(float);
    const TensorRect& r = w.rect;
    std::string err;
    if (r.cols == C) {
      err = put(base + uint64_t(r.row0) * C * sizeof(float), w.data, uint64_t(r.numel()) * sizeof(float));
    } else {
      for (int64_t i = 0; i < r.rows && err.empty(); i++)
        err = put(base + (uint64_t(r.row0 + i) * C + r.col0) * sizeof(float), w.data + i * r.cols,
                  uint64_t(r.cols) * sizeof(float));
    }
    if (!err.empty()) return err;
  }
  return "";
}

// ---- reading --------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(const CheckpointInfo& i)
    : info(i), whole(param_table_from_json(i.param_table_json, i.path)), file(open_checkpoint_file(i.path)) {}

void CheckpointReader::read(int group, size_t tensor, int64_t replica, const TensorRect& r, float* out) const {
  const ParamSlice& s = whole.slices.at(tensor);
  const hsize_t n = (hsize_t)r.numel();
  Id mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  const std::string name = info.version >= 3 ? dataset_name(group, s.name) : state_group_name(group);
  Id dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail_damaged(info, "it has no '" + name + "' dataset" + h5::detail());
  Id fspace(H5Dget_space(dset), H5Sclose);
  bool ok = fspace.valid();
  if (ok && info.version >= 3) {
    const std::vector<hsize_t> want = dataset_dims(s, info.rows);
    std::vector<hsize_t> dims(want.size());
    ok = H5Sget_simple_extent_ndims(fspace) == (int)want.size() &&
         H5Sget_simple_extent_dims(fspace, dims.data(), nullptr) >= 0 && dims == want;
    if (!ok) fail_damaged(info, "dataset '" + name + "' does not have the shape of its tensor");
    select_rect(fspace, s, info.rows, replica, r);
  } else if (ok) {  // versions 1 and 2: the tensor at its offset of the [rows, n] row
    const int64_t C = rows_cols(s.shape).second;
    const hsize_t start[2] = {(hsize_t)replica, s.offset + (hsize_t)(r.row0 * C + r.col0)};
    const hsize_t stride[2] = {1, (hsize_t)C}, count[2] = {1, (hsize_t)r.rows}, block[2] = {1, (hsize_t)r.cols};
    ok = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, stride, count, block) >= 0;
  }
  if (!ok || H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out) < 0)
    fail_damaged(info, "dataset '" + name + "' cannot be read (" + s.name + ", " + rect_text(r) + ")" + h5::detail());
}

void CheckpointReader::verify_share(int groups, int part, int parts) const {
  if (!info.checksummed) return;  // an older file: nothing to verify against
  std::vector<float> buf;
  int64_t unit = 0;
  auto mine = [&] { return unit++ % parts == part; };
  auto check = [&](uint32_t got, uint32_t want, const std::string& name, const std::string& where) {
    if (got == want) return;
    char sums[64];
    std::snprintf(sums, sizeof sums, " (CRC-32C %08x, stored %08x)", got, want);
    fail_damaged(info, "dataset '" + name + "' fails its checksum" + where + sums);
  };
  for (int g = 0; g < groups; g++) {
    if (info.version < 3) {  // blocks of 2^20 values of each row (checkpoint.h)
      const std::string name = state_group_name(g);
      Id dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!dset.valid()) fail_damaged(info, "it has no '" + name + "' dataset" + h5::detail());
      std::vector<uint32_t> crc;
      hsize_t block = 0;
      {
        Id attr(H5Aopen(dset, "crc32c", H5P_DEFAULT), H5Aclose);
        Id space(attr.valid() ? H5Aget_space(attr) : H5I_INVALID_HID, H5Sclose);
        int64_t b = 0;
        const hssize_t count = space.valid() ? H5Sget_simple_extent_npoints(space) : -1;
        if (count < 0 || !h5::read_int_attr(dset, "crc32c_block", b, describe(info.path), kRemedy) || b <= 0)
          fail_damaged(info, "the checksums of '" + name + "' are unreadable" + h5::detail());
        block = (hsize_t)b;
        crc.resize((size_t)count);
        if ((hsize_t)count != hsize_t(info.rows) * ((info.n + block - 1) / block) ||
            H5Aread(attr, H5T_NATIVE_UINT32, crc.data()) < 0)
          fail_damaged(info, "the checksums of '" + name + "' are unreadable" + h5::detail());
      }
      Id fspace(H5Dget_space(dset), H5Sclose);
      const hsize_t blocks = (info.n + block - 1) / block;
      for (int64_t row = 0; row < info.rows; row++)
        for (hsize_t b = 0; b < blocks; b++) {
          if (!mine()) continue;
          const hsize_t off = b * block;
          hsize_t start[2] = {(hsize_t)row, off}, count[2] = {1, std::min(block, info.n - off)};
          const std::string where = " in row " + std::to_string(row) + ", elements [" + std::to_string(off) + ", " +
                                    std::to_string(off + count[1]) + ")";
          buf.resize(count[1]);
          Id mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
          if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
              H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, buf.data()) < 0)
            fail_damaged(info, "dataset '" + name + "' cannot be read" + where + h5::detail());
          check(crc32c(buf.data(), count[1] * sizeof(float)), crc[size_t(row) * blocks + b], name, where);
        }
      continue;
    }
    for (size_t t = 0; t < whole.slices.size(); t++) {
      const ParamSlice& s = whole.slices[t];
      const std::string name = dataset_name(g, s.name);
      Id dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!dset.valid()) fail_damaged(info, "it has no '" + name + "' dataset" + h5::detail());
      std::vector<int64_t> rects;
      {
        Id attr(H5Aopen(dset, kRectAttr, H5P_DEFAULT), H5Aclose);
        Id space(attr.valid() ? H5Aget_space(attr) : H5I_INVALID_HID, H5Sclose);
        const hssize_t count = space.valid() ? H5Sget_simple_extent_npoints(space) : -1;
        if (count < 0 || count % kRectFields != 0) fail_damaged(info, "the checksums of '" + name + "' are unreadable");
        rects.resize((size_t)count);
        if (H5Aread(attr, H5T_NATIVE_INT64, rects.data()) < 0)
          fail_damaged(info, "the checksums of '" + name + "' are unreadable" + h5::detail());
      }
      const auto [R, C] = rows_cols(s.shape);
      int64_t covered = 0;
      for (size_t at = 0; at < rects.size(); at += kRectFields) {
        const int64_t replica = rects[at];
        const TensorRect r{rects[at + 1], rects[at + 2], rects[at + 3], rects[at + 4]};
        if (replica < 0 || replica >= info.rows || r.row0 < 0 || r.rows <= 0 || r.col0 < 0 || r.cols <= 0 ||
            r.row0 + r.rows > R || r.col0 + r.cols > C)
          fail_damaged(info, "the checksums of '" + name + "' name values outside it");
        covered += r.numel();
        if (!mine()) continue;
        buf.resize((size_t)r.numel());
        read(g, t, replica, r, buf.data());
        check(crc32c(buf.data(), buf.size() * sizeof(float)), (uint32_t)rects[at + 5], name,
              " in " + rect_text(r) + (info.rows > 1 ? " of replica " + std::to_string(replica) : ""));
      }
      if (covered != info.rows * R * C) fail_damaged(info, "the checksums of '" + name + "' do not cover it");
    }
  }
}

}  // namespace llmpi
