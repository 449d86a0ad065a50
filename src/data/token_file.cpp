// HDF5 token files: writer (atomic, via .tmp + rename) and validating hyperslab reader.
// Layout and attributes: see token_file.h.
#include "data/token_file.h"

#include "data/content_hash.h"
#include "data/h5_util.h"
#include "data/prep_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/error.h"

namespace llmpi {

using h5::Id;

namespace {

constexpr hsize_t kChunkTokens = 65536;
const char* const kRemake = "remake it with llmpi-prep";

std::string describe(const std::string& path) { return "token file '" + path + "'"; }

bool read_string_attr(hid_t obj, const char* name, std::string& out, const std::string& path) {
  return h5::read_string_attr(obj, name, out, describe(path), kRemake);
}
bool read_int_attr(hid_t obj, const char* name, int64_t& out, const std::string& path) {
  return h5::read_int_attr(obj, name, out, describe(path), kRemake);
}

int64_t require_int_attr(hid_t obj, const char* name, const std::string& path) {
  int64_t v = 0;
  if (!read_int_attr(obj, name, v, path))
    fail("token file '", path, "' has no '", name,
         "' attribute; it was not written by llmpi-prep (remake it with llmpi-prep)");
  return v;
}

}  // namespace

// ---- writer ----------------------------------------------------------------------------------

void TokenFileWriter::create(const std::string& path, int64_t n_tokens, const TokenFileAttrs& a) {
  h5::quiet();
  if (a.vocab_size <= 0 || a.vocab_size > INT32_MAX)
    fail("cannot write token file '", path, "': vocab_size ", a.vocab_size,
         " must be in 1..2147483647");
  if (a.eot_id < 0 || a.eot_id >= a.vocab_size)
    fail("cannot write token file '", path, "': eot_id ", a.eot_id, " is not below vocab_size ",
         a.vocab_size);
  if (n_tokens < 0) fail("cannot write token file '", path, "': negative size ", n_tokens);
  path_ = path;
  tmp_ = path + ".tmp";
  attrs_ = a;
  n_tokens_ = n_tokens;
  written_ = 0;
  pending_.clear();
  pending_.reserve(size_t(std::min<int64_t>(n_tokens, int64_t(kWriteTokens))));
  hash_ = Fnv1a64().h;
  guard_ = h5::TmpFileGuard{tmp_, false};
  const bool u16 = a.vocab_size <= 65535;
  file_ = Id(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file_.valid())
    fail("cannot create token file '", tmp_, "'", h5::detail(),
         "; check that its directory exists and is writable");

  // /tokens: 1-D, fixed size (unlimited when empty, since a chunk may not exceed a fixed
  // extent), chunked.
  const hsize_t n = hsize_t(n_tokens);
  h5::reserve_space(file_, uint64_t(n) * (u16 ? 2 : 4) + (1u << 20), path, describe(tmp_),
                    "free space or choose another --out");
  const hsize_t maxdim = n ? n : H5S_UNLIMITED;
  const hsize_t chunk = n ? std::min(n, kChunkTokens) : kChunkTokens;
  space_ = Id(H5Screate_simple(1, &n, &maxdim), H5Sclose);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space_.valid() || !dcpl.valid() || H5Pset_chunk(dcpl, 1, &chunk) < 0)
    fail("cannot set up dataset 'tokens' in '", tmp_, "'", h5::detail());
  dset_ = Id(H5Dcreate2(file_, "tokens", u16 ? H5T_STD_U16LE : H5T_STD_U32LE, space_, H5P_DEFAULT,
                        dcpl, H5P_DEFAULT),
             H5Dclose);
  if (!dset_.valid())
    fail("cannot create dataset 'tokens' in '", tmp_, "'", h5::detail(),
         "; check the disk space of its directory");
}

void TokenFileWriter::append(const uint32_t* tokens, size_t n) {
  if (!dset_.valid()) fail("TokenFileWriter::append called before create()");
  if (int64_t(n) > n_tokens_ - written_ - int64_t(pending_.size()))
    fail("cannot write token file '", path_, "': ", written_ + int64_t(pending_.size() + n),
         " tokens given for a file of ", n_tokens_);
  Fnv1a64 content{hash_};
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] >= uint64_t(attrs_.vocab_size))
      fail("cannot write token file '", path_, "': token ", written_ + int64_t(pending_.size() + i), " has id ",
           tokens[i], ", which is not below vocab_size ", attrs_.vocab_size,
           "; the tokens and the tokenizer do not match");
    content.add_le(tokens[i], 4);
  }
  hash_ = content.h;
  while (n > 0) {
    const size_t take = std::min(n, kWriteTokens - pending_.size());
    pending_.insert(pending_.end(), tokens, tokens + take);
    tokens += take;
    n -= take;
    if (pending_.size() == kWriteTokens) write_pending();
  }
}

void TokenFileWriter::write_pending() {
  if (pending_.empty()) return;
  // HDF5 converts the uint32 values to the file's type (all are < vocab_size, checked above).
  hsize_t off = hsize_t(written_), cnt = hsize_t(pending_.size());
  Id mspace(H5Screate_simple(1, &cnt, nullptr), H5Sclose);
  if (!mspace.valid() || H5Sselect_hyperslab(space_, H5S_SELECT_SET, &off, nullptr, &cnt, nullptr) < 0 ||
      H5Dwrite(dset_, H5T_NATIVE_UINT32, mspace, space_, H5P_DEFAULT, pending_.data()) < 0)
    fail("cannot write ", cnt, " tokens to '", tmp_, "'", h5::detail(),
         "; check the disk space of its directory");
  written_ += int64_t(cnt);
  pending_.clear();
}

std::string TokenFileWriter::finish() {
  if (!file_.valid()) fail("TokenFileWriter::finish called before create()");
  write_pending();
  if (written_ != n_tokens_)
    fail("cannot finish token file '", path_, "': ", written_, " of its ", n_tokens_, " tokens were written");
  h5::write_string_attr(file_, "format", kTokenFileFormat, describe(tmp_));
  h5::write_int_attr(file_, "version", kTokenFileVersion, describe(tmp_));
  h5::write_int_attr(file_, "vocab_size", attrs_.vocab_size, describe(tmp_));
  h5::write_int_attr(file_, "eot_id", attrs_.eot_id, describe(tmp_));
  h5::write_string_attr(file_, "tokenizer", attrs_.tokenizer, describe(tmp_));
  h5::write_string_attr(file_, "created_by", attrs_.created_by, describe(tmp_));
  const std::string hash = Fnv1a64{hash_}.hex();
  h5::write_string_attr(file_, kContentHashAttr, hash, describe(tmp_));
  if (dset_.reset() < 0 || space_.reset() < 0 || H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0 || file_.reset() < 0)
    fail("cannot finish writing token file '", tmp_, "'", h5::detail(),
         "; check the disk space of its directory");
  h5::commit_tmp_file(tmp_, path_, guard_);
  return hash;
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const TokenFileAttrs& a) {
  TokenFileWriter w;
  w.create(path, int64_t(tokens.size()), a);
  w.append(tokens.data(), tokens.size());
  w.finish();
}

// ---- reader ----------------------------------------------------------------------------------

namespace {

// Open one token file as it is and validate it; its handles go to file/dset/space.
TokenFileInfo open_one(const std::string& path, Id& file_out, Id& dset_out, Id& space_out) {
  h5::quiet();
  // The file itself: present, a regular file, readable, HDF5.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      fail("token file '", path, "' does not exist; check the path, or make it with llmpi-prep");
    fail("cannot access token file '", path, "': ", std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode))
    fail("token file '", path, "' is a directory; give the path of a .h5 file inside it "
         "(llmpi-prep writes DIR/train.h5 and DIR/val.h5)");
  if (::access(path.c_str(), R_OK) != 0)
    fail("cannot read token file '", path, "': ", std::strerror(errno), "; check its permissions");
  if (!h5::has_signature(path))
    fail("'", path, "' is not an HDF5 file, so not an llmpi token file; make one with llmpi-prep");

  // Open read-only; keep file locking, but do not fail on file systems without it.
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl, true, true);
#endif
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!file.valid())
    fail("token file '", path, "' is damaged or truncated and cannot be opened", h5::detail(),
         "; remake it with llmpi-prep");

  TokenFileInfo info;
  info.path = path;
  std::string format;
  if (!read_string_attr(file, "format", format, path))
    fail("'", path, "' has no 'format' attribute: it is an HDF5 file but not an llmpi token file; "
         "make one with llmpi-prep");
  if (format != kTokenFileFormat)
    fail("'", path, "' has format '", format, "', not '", kTokenFileFormat,
         "': it is not an llmpi token file; make one with llmpi-prep");
  int64_t version = require_int_attr(file, "version", path);
  if (version != kTokenFileVersion)
    fail("token file '", path, "' has version ", version, ", but this llmpi reads version ",
         kTokenFileVersion, "; remake it with this build's llmpi-prep");
  info.version = int(version);
  info.vocab_size = require_int_attr(file, "vocab_size", path);
  info.eot_id = require_int_attr(file, "eot_id", path);
  if (info.vocab_size <= 0 || info.vocab_size > INT32_MAX)
    fail("token file '", path, "' has vocab_size ", info.vocab_size,
         ", outside 1..2147483647; remake it with llmpi-prep");
  if (info.eot_id < 0 || info.eot_id >= info.vocab_size)
    fail("token file '", path, "' has eot_id ", info.eot_id, ", not below its vocab_size ",
         info.vocab_size, "; remake it with llmpi-prep");
  if (!read_string_attr(file, "tokenizer", info.tokenizer, path))
    fail("token file '", path, "' has no 'tokenizer' attribute; remake it with llmpi-prep");
  read_string_attr(file, "created_by", info.created_by, path);  // optional
  read_string_attr(file, kContentHashAttr, info.content_hash, path);  // optional (older files)

  // /tokens: a 1-D dataset of unsigned 16- or 32-bit integers.
  htri_t exists = H5Lexists(file, "tokens", H5P_DEFAULT);
  if (exists <= 0)
    fail("token file '", path, "' has no 'tokens' dataset", h5::detail(),
         "; it is damaged or not a language-modelling token file (remake it with llmpi-prep)");
  Id dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  if (dapl.valid()) H5Pset_chunk_cache(dapl, 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT);  // read selections directly
  Id dset(H5Dopen2(file, "tokens", dapl.valid() ? hid_t(dapl) : H5P_DEFAULT), H5Dclose);
  if (!dset.valid())
    fail("token file '", path, "': 'tokens' is not a readable dataset", h5::detail(),
         "; remake the file with llmpi-prep");
  Id type(H5Dget_type(dset), H5Tclose);
  Id space(H5Dget_space(dset), H5Sclose);
  if (!type.valid() || !space.valid())
    fail("token file '", path, "' is damaged: cannot read the type/shape of 'tokens'", h5::detail(),
         "; remake it with llmpi-prep");
  int rank = H5Sget_simple_extent_ndims(space);
  if (rank != 1)
    fail("token file '", path, "': 'tokens' has ", rank,
         " dimensions, but must be 1-D; remake the file with llmpi-prep");
  size_t size = H5Tget_size(type);
  if (H5Tget_class(type) != H5T_INTEGER || H5Tget_sign(type) != H5T_SGN_NONE ||
      (size != 2 && size != 4))
    fail("token file '", path, "': 'tokens' must hold uint16 or uint32 values, but holds another "
         "type; remake the file with llmpi-prep");
  hsize_t dim = 0;
  H5Sget_simple_extent_dims(space, &dim, nullptr);
  info.n_tokens = int64_t(dim);
  info.dtype_bytes = int(size);
  info.dtype = size == 2 ? "uint16" : "uint32";
  Id dcpl(H5Dget_create_plist(dset), H5Pclose);
  hsize_t chunk = 0;
  if (dcpl.valid() && H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 1, &chunk) == 1)
    info.chunk = int64_t(chunk);

  file_out = std::move(file);
  dset_out = std::move(dset);
  space_out = std::move(space);
  return info;
}

// A file of a data set must be the one its manifest names: same size and content hash.
void check_listed(const TokenFileInfo& f, const ShardEntry& want, const std::string& manifest) {
  if (f.content_hash == want.content_hash && f.n_tokens == want.tokens) return;
  fail("'", f.path, "' is not the file that '", manifest, "' names (its content fnv1a64 is ",
       f.content_hash.empty() ? "(none)" : f.content_hash, " and it holds ", f.n_tokens,
       " tokens; the manifest says ", want.content_hash, " and ", want.tokens,
       "): the data set was changed after llmpi-prep wrote it; rerun llmpi-prep");
}

}  // namespace

void TokenReader::close() {
  handles_.clear();
  shards_.clear();
  n_open_ = 0;
  info_ = TokenFileInfo();
}

void TokenReader::open(const std::string& path) {
  close();
  const TokenDataRef ref = resolve_token_data(path);
  std::vector<Shard> shards;
  std::vector<Handles> handles(ref.files.size());
  TokenFileInfo info;
  int64_t offset = 0;
  for (size_t i = 0; i < ref.files.size(); i++) {
    TokenFileInfo f;
    if (ref.split.empty()) {
      f = open_one(ref.files[i], handles[i].file, handles[i].dset, handles[i].space);
      if (ref.listed) check_listed(f, *ref.listed, ref.manifest_path());
      f.path = ref.path;
      info = f;
    } else {
      const SplitEntry& split = *ref.split_entry();
      const PrepManifest& m = *ref.manifest;
      try {
        f = open_one(ref.files[i], handles[i].file, handles[i].dset, handles[i].space);
      } catch (const Error& e) {
        fail("split '", ref.split, "' of '", ref.manifest_path(), "' is incomplete or damaged: ", e.what());
      }
      check_listed(f, split.shards[i], ref.manifest_path());
      if (f.vocab_size != m.vocab_size || f.eot_id != m.eot_id || f.tokenizer != m.tokenizer)
        fail("'", f.path, "' has vocab_size ", f.vocab_size, ", eot_id ", f.eot_id, " and tokenizer '",
             f.tokenizer, "', but '", ref.manifest_path(), "' says ", m.vocab_size, ", ", m.eot_id, " and '",
             m.tokenizer, "': the data set was changed after llmpi-prep wrote it; rerun llmpi-prep");
      if (i == 0) {
        info = f;
        info.path = ref.path;
        info.created_by = m.created_by;
        info.content_hash = split.content_hash;
        info.n_tokens = split.size;
        info.split = ref.split;
        info.manifest = ref.manifest_path();
        info.n_shards = int64_t(ref.files.size());
      } else if (f.dtype_bytes != info.dtype_bytes) {
        fail("'", f.path, "' holds ", f.dtype, " tokens but the split's first shard ", info.dtype,
             "; the data set was changed after llmpi-prep wrote it; rerun llmpi-prep");
      }
      if (i >= size_t(max_open_shards_)) handles[i] = Handles();
    }
    shards.push_back({ref.files[i], offset, f.n_tokens, f.content_hash});
    offset += f.n_tokens;
  }
  info_ = std::move(info);
  shards_ = std::move(shards);
  handles_ = std::move(handles);
  n_open_ = 0;
  for (const Handles& h : handles_) n_open_ += h.dset.valid();
}

TokenReader::Handles& TokenReader::open_shard(size_t i) {
  Handles& h = handles_[i];
  h.last_use = ++clock_;
  if (h.dset.valid()) return h;
  if (n_open_ >= max_open_shards_) {
    size_t lru = i;
    for (size_t j = 0; j < handles_.size(); j++)
      if (handles_[j].dset.valid() && (lru == i || handles_[j].last_use < handles_[lru].last_use)) lru = j;
    handles_[lru] = Handles();
    n_open_--;
  }
  open_one(shards_[i].path, h.file, h.dset, h.space);
  n_open_++;
  return h;
}

void TokenReader::read_shard(size_t i, int64_t start, int64_t count, int32_t* out) {
  Handles& h = open_shard(i);
  const std::string& path = shards_[i].path;
  hsize_t off = hsize_t(start), cnt = hsize_t(count);
  Id mspace(H5Screate_simple(1, &cnt, nullptr), H5Sclose);
  // Read as uint32 into the int32 buffer: no value is clamped, so a bad id is reported as it is.
  uint32_t* u = reinterpret_cast<uint32_t*>(out);
  if (!mspace.valid() ||
      H5Sselect_hyperslab(h.space, H5S_SELECT_SET, &off, nullptr, &cnt, nullptr) < 0 ||
      H5Dread(h.dset, H5T_NATIVE_UINT32, mspace, h.space, H5P_DEFAULT, u) < 0)
    fail("cannot read tokens [", start, ", ", start + count, ") from '", path,
         "': the file is damaged or truncated", h5::detail(), "; remake it with llmpi-prep");
  const uint32_t vocab = uint32_t(info_.vocab_size);
  for (int64_t k = 0; k < count; k++)
    if (u[k] >= vocab)
      fail("token file '", path, "' holds token id ", u[k], " at position ", start + k,
           ", but its vocab_size is ", info_.vocab_size,
           ": the file, its tokenizer and the model's vocabulary do not match; remake the file "
           "with llmpi-prep using the model's tokenizer");
}

void TokenReader::read(int64_t start, int64_t count, int32_t* out) {
  if (!is_open()) fail("TokenReader::read called before open(); open a token file first");
  if (start < 0 || count < 0 || start > info_.n_tokens || count > info_.n_tokens - start)
    fail("cannot read tokens [", start, ", ", start + count, ") from '", info_.path, "': it has ",
         info_.n_tokens, " tokens (valid positions 0..", info_.n_tokens - 1,
         "); the sample window or data split is larger than the file");
  while (count > 0) {
    // The last shard that starts at or before `start` (empty shards share their successor's offset).
    size_t i = size_t(std::upper_bound(shards_.begin(), shards_.end(), start,
                                       [](int64_t s, const Shard& sh) { return s < sh.offset; }) -
                      shards_.begin()) - 1;
    const int64_t local = start - shards_[i].offset;
    const int64_t n = std::min(count, shards_[i].n_tokens - local);
    read_shard(i, local, n, out);
    start += n;
    out += n;
    count -= n;
  }
}

std::vector<int32_t> TokenReader::read(int64_t start, int64_t count) {
  std::vector<int32_t> out(size_t(count > 0 ? count : 0));
  read(start, count, out.data());
  return out;
}

TokenFileInfo open_token_file_info(const std::string& path) {
  TokenReader r(path);
  return r.info();
}

TokenFileInfo open_single_token_file_info(const std::string& path) {
  Id file, dset, space;
  return open_one(path, file, dset, space);
}

}  // namespace llmpi
