// HDF5 token files: writer (atomic, via .tmp + rename) and validating hyperslab reader.
// Layout and attributes: see token_file.h.
#include "data/token_file.h"

#include "data/content_hash.h"
#include "data/h5_util.h"

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

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const TokenFileAttrs& a) {
  h5::quiet();
  if (a.vocab_size <= 0 || a.vocab_size > INT32_MAX)
    fail("cannot write token file '", path, "': vocab_size ", a.vocab_size,
         " must be in 1..2147483647");
  if (a.eot_id < 0 || a.eot_id >= a.vocab_size)
    fail("cannot write token file '", path, "': eot_id ", a.eot_id, " is not below vocab_size ",
         a.vocab_size);
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] >= uint64_t(a.vocab_size))
      fail("cannot write token file '", path, "': token ", i, " has id ", tokens[i],
           ", which is not below vocab_size ", a.vocab_size,
           "; the tokens and the tokenizer do not match");

  const bool u16 = a.vocab_size <= 65535;
  const std::string tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  {
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid())
      fail("cannot create token file '", tmp, "'", h5::detail(),
           "; check that its directory exists and is writable");

    // /tokens: 1-D, fixed size (unlimited when empty, since a chunk may not exceed a fixed
    // extent), chunked.
    const hsize_t n = tokens.size();
    h5::reserve_space(file, uint64_t(n) * (u16 ? 2 : 4) + (1u << 20), path, describe(tmp),
                      "free space or choose another --out");
    const hsize_t maxdim = n ? n : H5S_UNLIMITED;
    const hsize_t chunk = n ? std::min(n, kChunkTokens) : kChunkTokens;
    Id space(H5Screate_simple(1, &n, &maxdim), H5Sclose);
    Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (!space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl, 1, &chunk) < 0)
      fail("cannot set up dataset 'tokens' in '", tmp, "'", h5::detail());
    Id dset(H5Dcreate2(file, "tokens", u16 ? H5T_STD_U16LE : H5T_STD_U32LE, space, H5P_DEFAULT,
                       dcpl, H5P_DEFAULT),
            H5Dclose);
    if (!dset.valid())
      fail("cannot create dataset 'tokens' in '", tmp, "'", h5::detail(),
           "; check the disk space of its directory");
    // HDF5 converts the uint32 values to the file's type (all are < vocab_size, checked above).
    if (n > 0 && H5Dwrite(dset, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()) < 0)
      fail("cannot write ", n, " tokens to '", tmp, "'", h5::detail(),
           "; check the disk space of its directory");

    h5::write_string_attr(file, "format", kTokenFileFormat, describe(tmp));
    h5::write_int_attr(file, "version", kTokenFileVersion, describe(tmp));
    h5::write_int_attr(file, "vocab_size", a.vocab_size, describe(tmp));
    h5::write_int_attr(file, "eot_id", a.eot_id, describe(tmp));
    h5::write_string_attr(file, "tokenizer", a.tokenizer, describe(tmp));
    h5::write_string_attr(file, "created_by", a.created_by, describe(tmp));
    Fnv1a64 content;
    for (uint32_t t : tokens) content.add_le(t, 4);
    h5::write_string_attr(file, kContentHashAttr, content.hex(), describe(tmp));

    if (dset.reset() < 0 || space.reset() < 0 || dcpl.reset() < 0 ||
        H5Fflush(file, H5F_SCOPE_GLOBAL) < 0 || file.reset() < 0)
      fail("cannot finish writing token file '", tmp, "'", h5::detail(),
           "; check the disk space of its directory");
  }
  h5::commit_tmp_file(tmp, path, guard);
}

// ---- reader ----------------------------------------------------------------------------------

void TokenReader::close() {
  fspace_.reset();
  dset_.reset();
  file_.reset();
  info_ = TokenFileInfo();
}

void TokenReader::open(const std::string& path) {
  h5::quiet();
  close();

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
  Id dset(H5Dopen2(file, "tokens", H5P_DEFAULT), H5Dclose);
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

  info_ = std::move(info);
  file_ = std::move(file);
  dset_ = std::move(dset);
  fspace_ = std::move(space);
}

void TokenReader::read(int64_t start, int64_t count, int32_t* out) {
  if (!is_open()) fail("TokenReader::read called before open(); open a token file first");
  const std::string& path = info_.path;
  if (start < 0 || count < 0 || start > info_.n_tokens || count > info_.n_tokens - start)
    fail("cannot read tokens [", start, ", ", start + count, ") from '", path, "': it has ",
         info_.n_tokens, " tokens (valid positions 0..", info_.n_tokens - 1,
         "); the sample window or data split is larger than the file");
  if (count == 0) return;
  hsize_t off = hsize_t(start), cnt = hsize_t(count);
  Id mspace(H5Screate_simple(1, &cnt, nullptr), H5Sclose);
  // Read as uint32 into the int32 buffer: no value is clamped, so a bad id is reported as it is.
  uint32_t* u = reinterpret_cast<uint32_t*>(out);
  if (!mspace.valid() ||
      H5Sselect_hyperslab(fspace_, H5S_SELECT_SET, &off, nullptr, &cnt, nullptr) < 0 ||
      H5Dread(dset_, H5T_NATIVE_UINT32, mspace, fspace_, H5P_DEFAULT, u) < 0)
    fail("cannot read tokens [", start, ", ", start + count, ") from '", path,
         "': the file is damaged or truncated", h5::detail(), "; remake it with llmpi-prep");
  const uint32_t vocab = uint32_t(info_.vocab_size);
  for (int64_t i = 0; i < count; i++)
    if (u[i] >= vocab)
      fail("token file '", path, "' holds token id ", u[i], " at position ", start + i,
           ", but its vocab_size is ", info_.vocab_size,
           ": the file, its tokenizer and the model's vocabulary do not match; remake the file "
           "with llmpi-prep using the model's tokenizer");
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

}  // namespace llmpi
