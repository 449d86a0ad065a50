// HDF5 classification files: writer (atomic, via .tmp + rename), validating row reader, and the
// format probe. Layout and attributes: see classification_file.h.
#include "data/classification_file.h"

#include "data/content_hash.h"
#include "data/h5_util.h"
#include "data/prep_manifest.h"
#include "data/token_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "runtime/error.h"

namespace llmpi {

using h5::Id;

namespace {

const char* const kRemake = "remake it with `llmpi-prep glue`";

std::string describe(const std::string& path) { return "classification file '" + path + "'"; }

bool read_string_attr(hid_t obj, const char* name, std::string& out, const std::string& path) {
  return h5::read_string_attr(obj, name, out, describe(path), kRemake);
}

int64_t require_int_attr(hid_t obj, const char* name, const std::string& path) {
  int64_t v = 0;
  if (!h5::read_int_attr(obj, name, v, describe(path), kRemake))
    fail("classification file '", path, "' has no '", name,
         "' attribute; it was not written by `llmpi-prep glue` (remake it with `llmpi-prep glue`)");
  return v;
}

// The four datasets, in the order they are written and checked.
struct DatasetSpec {
  const char* name;
  int rank;          // 2: [N, L], 1: [N]
  hid_t file_type;   // what the writer stores
  const char* type_name;
};
const DatasetSpec kInputIds{"input_ids", 2, H5T_STD_I32LE, "int32"};
const DatasetSpec kTokenTypeIds{"token_type_ids", 2, H5T_STD_U8LE, "uint8"};
const DatasetSpec kAttentionMask{"attention_mask", 2, H5T_STD_U8LE, "uint8"};
const DatasetSpec kLabels{"labels", 1, H5T_STD_I32LE, "int32"};

// A value that breaks the layout's rules, found by first_bad_value.
struct BadValue {
  enum Kind { kNone, kTokenId, kTokenType, kMask, kLabel } kind = kNone;
  int64_t example = 0;   // the example's index in the file
  int64_t position = 0;  // the token position in the example (not for labels)
  int64_t value = 0;
};

// Check `rows` examples laid out as in ClassificationExamples. example_of_row maps a row to its
// index in the file (nullptr: row r is example r), so messages name the example the user can find.
BadValue first_bad_value(const int32_t* ids, const int32_t* types, const int32_t* mask,
                         const int32_t* labels, int64_t rows, int64_t seq_len, int64_t vocab_size,
                         int64_t num_labels, const int64_t* example_of_row) {
  auto bad = [&](BadValue::Kind kind, int64_t row, int64_t pos, int64_t value) {
    BadValue b;
    b.kind = kind;
    b.example = example_of_row ? example_of_row[row] : row;
    b.position = pos;
    b.value = value;
    return b;
  };
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = r * seq_len;
    for (int64_t p = 0; p < seq_len; p++) {
      const int64_t i = base + p;
      if (ids[i] < 0 || ids[i] >= vocab_size) return bad(BadValue::kTokenId, r, p, ids[i]);
      if (types[i] != 0 && types[i] != 1) return bad(BadValue::kTokenType, r, p, types[i]);
      if (mask[i] != 0 && mask[i] != 1) return bad(BadValue::kMask, r, p, mask[i]);
    }
    if (labels[r] < 0 || labels[r] >= num_labels) return bad(BadValue::kLabel, r, 0, labels[r]);
  }
  return BadValue();
}

// "example 3 has token id 300 at position 5, which is not below vocab_size 257" (no fix: the
// writer and the reader suggest different ones).
std::string describe_bad_value(const BadValue& b, int64_t vocab_size, int64_t num_labels) {
  std::string where = "example " + std::to_string(b.example);
  std::string at = " at position " + std::to_string(b.position);
  std::string v = std::to_string(b.value);
  switch (b.kind) {
    case BadValue::kTokenId:
      return where + " has token id " + v + at + ", which is not in 0.." +
             std::to_string(vocab_size - 1) + " (vocab_size " + std::to_string(vocab_size) + ")";
    case BadValue::kTokenType:
      return where + " has token_type_ids value " + v + at +
             ", but token types must be 0 (first segment) or 1 (second segment)";
    case BadValue::kMask:
      return where + " has attention_mask value " + v + at +
             ", but the mask must be 1 (real token) or 0 (padding)";
    case BadValue::kLabel:
      return where + " has label " + v + ", which is not in 0.." + std::to_string(num_labels - 1) +
             " (num_labels " + std::to_string(num_labels) + ")";
    case BadValue::kNone:
      break;
  }
  return where;
}

// "int32", "uint8", "float32", "string", ... for messages about a dataset of the wrong type.
std::string type_name(hid_t type) {
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") +
             std::to_string(8 * H5Tget_size(type));
    case H5T_FLOAT:
      return "float" + std::to_string(8 * H5Tget_size(type));
    case H5T_STRING:
      return "string";
    default:
      return "a non-numeric type";
  }
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// ---- writer helpers ----

// A 1-D attribute of variable-length UTF-8 strings (h5py reads it as a list of str).
void write_string_array_attr(hid_t obj, const char* name, const std::vector<std::string>& v,
                             const std::string& what) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const hsize_t n = v.size();
  Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  std::vector<const char*> ptrs;
  for (const std::string& s : v) ptrs.push_back(s.c_str());
  Id attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || (n > 0 && H5Awrite(attr, type, ptrs.data()) < 0))
    fail("cannot write attribute '", name, "' to ", what, h5::detail(),
         "; check the disk space and permissions of its directory");
}

// Create one contiguous dataset of n rows and write it from int32 memory (HDF5 converts to the
// file type; every value was range-checked first, so nothing is clamped).
void write_dataset(hid_t file, const DatasetSpec& spec, hsize_t n, hsize_t seq_len,
                   const std::vector<int32_t>& data, const std::string& tmp) {
  const hsize_t dims[2] = {n, seq_len};
  Id space(H5Screate_simple(spec.rank, dims, nullptr), H5Sclose);
  if (!space.valid()) fail("cannot set up dataset '", spec.name, "' in '", tmp, "'", h5::detail());
  Id dset(H5Dcreate2(file, spec.name, spec.file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose);
  if (!dset.valid())
    fail("cannot create dataset '", spec.name, "' in '", tmp, "'", h5::detail(),
         "; check the disk space of its directory");
  if (!data.empty() && H5Dwrite(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
    fail("cannot write dataset '", spec.name, "' (", data.size(), " values) to '", tmp, "'",
         h5::detail(), "; check the disk space of its directory");
  if (dset.reset() < 0)
    fail("cannot finish dataset '", spec.name, "' in '", tmp, "'", h5::detail(),
         "; check the disk space of its directory");
}

// ---- reader helpers ----

// The file itself: present, a regular file, readable, HDF5. Then open it read-only.
Id open_hdf5_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      fail("classification file '", path,
           "' does not exist; check the path, or make it with `llmpi-prep glue`");
    fail("cannot access classification file '", path, "': ", std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode))
    fail("classification file '", path, "' is a directory; give the path of a .h5 file inside it");
  if (::access(path.c_str(), R_OK) != 0)
    fail("cannot read classification file '", path, "': ", std::strerror(errno),
         "; check its permissions");
  if (!h5::has_signature(path))
    fail("'", path, "' is not an HDF5 file, so not an llmpi classification file; make one with "
         "`llmpi-prep glue`");

  // Keep file locking, but do not fail on file systems without it.
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl, true, true);
#endif
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!file.valid())
    fail("classification file '", path, "' is damaged or truncated and cannot be opened",
         h5::detail(), "; ", kRemake);
  return file;
}

// The 1-D string attribute label_names, variable- or fixed-length strings (h5py writes either).
std::vector<std::string> read_label_names(hid_t file, const std::string& path) {
  htri_t exists = H5Aexists(file, "label_names");
  if (exists < 0)
    fail("classification file '", path, "' is damaged: cannot look up attribute 'label_names'",
         h5::detail(), "; ", kRemake);
  if (exists == 0)
    fail("classification file '", path, "' has no 'label_names' attribute; it was not written by "
         "`llmpi-prep glue` (", kRemake, ")");
  Id attr(H5Aopen(file, "label_names", H5P_DEFAULT), H5Aclose);
  Id space(H5Aget_space(attr), H5Sclose);
  Id type(H5Aget_type(attr), H5Tclose);
  if (!attr.valid() || !space.valid() || !type.valid())
    fail("classification file '", path, "' is damaged: cannot open attribute 'label_names'",
         h5::detail(), "; ", kRemake);
  if (H5Tget_class(type) != H5T_STRING || H5Sget_simple_extent_ndims(space) != 1)
    fail("classification file '", path,
         "': attribute 'label_names' must be a 1-D array of strings (one name per label); ", kRemake);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<std::string> names;
  if (n <= 0) return names;
  const auto read_failed = [&] {
    fail("classification file '", path, "' is damaged: cannot read attribute 'label_names'",
         h5::detail(), "; ", kRemake);
  };
  if (H5Tis_variable_str(type) > 0) {
    Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(type));
    std::vector<char*> ptrs(size_t(n), nullptr);
    if (H5Aread(attr, mem, ptrs.data()) < 0) read_failed();
    for (char* p : ptrs) {
      names.emplace_back(p ? p : "");
      if (p) H5free_memory(p);
    }
  } else {
    const size_t width = H5Tget_size(type);
    std::vector<char> buf(size_t(n) * width + 1, '\0');
    if (H5Aread(attr, type, buf.data()) < 0) read_failed();
    for (hssize_t i = 0; i < n; i++) {
      const char* s = buf.data() + size_t(i) * width;
      names.emplace_back(s, strnlen(s, width));  // null-terminated or null-padded
    }
  }
  return names;
}

// Open one of the four datasets and check its rank and type; dims gets its shape.
Id open_dataset(hid_t file, const DatasetSpec& spec, const std::string& path, std::vector<hsize_t>& dims) {
  htri_t exists = H5Lexists(file, spec.name, H5P_DEFAULT);
  if (exists <= 0)
    fail("classification file '", path, "' has no '", spec.name, "' dataset", h5::detail(),
         "; it is damaged or was not written by `llmpi-prep glue` (", kRemake, ")");
  Id dset(H5Dopen2(file, spec.name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid())
    fail("classification file '", path, "': '", spec.name, "' is not a readable dataset",
         h5::detail(), "; ", kRemake);
  Id type(H5Dget_type(dset), H5Tclose);
  Id space(H5Dget_space(dset), H5Sclose);
  if (!type.valid() || !space.valid())
    fail("classification file '", path, "' is damaged: cannot read the type/shape of '", spec.name,
         "'", h5::detail(), "; ", kRemake);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank != spec.rank)
    fail("classification file '", path, "': '", spec.name, "' has ", rank, " dimensions, but must be ",
         spec.rank == 2 ? "2-D [examples, seq_len]" : "1-D [examples]", "; ", kRemake);
  // The exact type of the layout: a wider type would be silently clamped when read as int32.
  const bool want_unsigned = std::strcmp(spec.type_name, "uint8") == 0;
  const size_t want_size = want_unsigned ? 1 : 4;
  if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != want_size ||
      (H5Tget_sign(type) == H5T_SGN_NONE) != want_unsigned)
    fail("classification file '", path, "': '", spec.name, "' must hold ", spec.type_name,
         " values, but holds ", type_name(type), "; ", kRemake);
  dims.assign(size_t(rank), 0);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dset;
}

}  // namespace

// ---- writer ----------------------------------------------------------------------------------

void write_classification_file(const std::string& path, const ClassificationExamples& ex,
                               const ClassificationAttrs& a) {
  h5::quiet();
  const std::string cannot = "cannot write classification file '" + path + "': ";
  if (ex.seq_len <= 0) fail(cannot, "seq_len ", ex.seq_len, " must be at least 1");
  if (a.vocab_size <= 0 || a.vocab_size > INT32_MAX)
    fail(cannot, "vocab_size ", a.vocab_size, " must be in 1..2147483647");
  if (a.num_labels <= 0) fail(cannot, "num_labels ", a.num_labels, " must be at least 1");
  if (a.label_names.size() != size_t(a.num_labels))
    fail(cannot, "there are ", a.label_names.size(), " label_names for num_labels ", a.num_labels,
         "; give one name per label");
  if (a.pad_id < 0 || a.pad_id >= a.vocab_size)
    fail(cannot, "pad_id ", a.pad_id, " is not below vocab_size ", a.vocab_size);

  const size_t n = ex.labels.size(), L = size_t(ex.seq_len);
  const auto check_size = [&](const char* name, size_t got) {
    if (got != n * L)
      fail(cannot, name, " holds ", got, " values, but ", n, " examples (the size of labels) of seq_len ",
           L, " need ", n * L, "; the example arrays do not line up");
  };
  check_size("input_ids", ex.input_ids.size());
  check_size("token_type_ids", ex.token_type_ids.size());
  check_size("attention_mask", ex.attention_mask.size());

  BadValue bad = first_bad_value(ex.input_ids.data(), ex.token_type_ids.data(), ex.attention_mask.data(),
                                 ex.labels.data(), int64_t(n), int64_t(L), a.vocab_size, a.num_labels,
                                 nullptr);
  if (bad.kind != BadValue::kNone) {
    const char* why = bad.kind == BadValue::kTokenId ? "; the examples and the tokenizer do not match"
                      : bad.kind == BadValue::kLabel ? "; the labels and num_labels do not match"
                                                     : "";
    fail(cannot, describe_bad_value(bad, a.vocab_size, a.num_labels), why);
  }

  const std::string tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  {
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid())
      fail("cannot create classification file '", tmp, "'", h5::detail(),
           "; check that its directory exists and is writable");
    h5::reserve_space(file, uint64_t(n) * (L * 6 + 4) + (1u << 20), path, describe(tmp),
                      "free space or write the file somewhere else");
    write_dataset(file, kInputIds, n, L, ex.input_ids, tmp);
    write_dataset(file, kTokenTypeIds, n, L, ex.token_type_ids, tmp);
    write_dataset(file, kAttentionMask, n, L, ex.attention_mask, tmp);
    write_dataset(file, kLabels, n, L, ex.labels, tmp);

    const std::string what = describe(tmp);
    h5::write_string_attr(file, "format", kClassificationFileFormat, what);
    h5::write_int_attr(file, "version", kClassificationFileVersion, what);
    h5::write_int_attr(file, "vocab_size", a.vocab_size, what);
    h5::write_int_attr(file, "num_labels", a.num_labels, what);
    write_string_array_attr(file, "label_names", a.label_names, what);
    h5::write_int_attr(file, "pad_id", a.pad_id, what);
    h5::write_string_attr(file, "tokenizer", a.tokenizer, what);
    h5::write_string_attr(file, "created_by", a.created_by, what);
    Fnv1a64 content;  // the bytes the file stores, dataset by dataset
    for (int32_t v : ex.input_ids) content.add_le(uint32_t(v), 4);
    for (int32_t v : ex.token_type_ids) content.add_le(uint32_t(v), 1);
    for (int32_t v : ex.attention_mask) content.add_le(uint32_t(v), 1);
    for (int32_t v : ex.labels) content.add_le(uint32_t(v), 4);
    h5::write_string_attr(file, kContentHashAttr, content.hex(), what);

    if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0 || file.reset() < 0)
      fail("cannot finish writing classification file '", tmp, "'", h5::detail(),
           "; check the disk space of its directory");
  }
  h5::commit_tmp_file(tmp, path, guard);
}

// ---- reader ----------------------------------------------------------------------------------

void ClassificationReader::close() {
  labels_.reset();
  attention_mask_.reset();
  token_type_ids_.reset();
  input_ids_.reset();
  file_.reset();
  info_ = ClassificationInfo();
}

void ClassificationReader::open(const std::string& given) {
  h5::quiet();
  close();
  // A split of a data set directory (DIR/train.h5, DIR/dev, DIR) is the one file its manifest
  // names, which must hold what the manifest says.
  const TokenDataRef ref = resolve_token_data(given);
  if (ref.files.size() != 1)
    fail("'", given, "' names a split of ", ref.files.size(), " files in '", ref.manifest_path(),
         "', but a classification split is one file; remake it with `llmpi-prep glue`");
  const std::string path = ref.files[0];
  const ShardEntry* listed = ref.split_entry() ? &ref.split_entry()->shards[0] : ref.listed ? &*ref.listed : nullptr;
  Id file = open_hdf5_file(path);

  ClassificationInfo info;
  info.path = path;
  std::string format;
  if (!read_string_attr(file, "format", format, path))
    fail("'", path, "' has no 'format' attribute: it is an HDF5 file but not an llmpi "
         "classification file; make one with `llmpi-prep glue`");
  if (format == kTokenFileFormat)
    fail("'", path, "' is a language-modelling token file (format '", kTokenFileFormat,
         "'), not a classification file (format '", kClassificationFileFormat,
         "'); make one from a GLUE-style task with `llmpi-prep glue`, or use this file with a "
         "language-modelling model");
  if (format != kClassificationFileFormat)
    fail("'", path, "' has format '", format, "', not '", kClassificationFileFormat,
         "': it is not an llmpi classification file; make one with `llmpi-prep glue`");
  const int64_t version = require_int_attr(file, "version", path);
  if (version != kClassificationFileVersion)
    fail("classification file '", path, "' has version ", version, ", but this llmpi reads version ",
         kClassificationFileVersion, "; remake it with this build's `llmpi-prep glue`");
  info.version = int(version);

  info.vocab_size = require_int_attr(file, "vocab_size", path);
  if (info.vocab_size <= 0 || info.vocab_size > INT32_MAX)
    fail("classification file '", path, "' has vocab_size ", info.vocab_size,
         ", outside 1..2147483647; ", kRemake);
  const int64_t num_labels = require_int_attr(file, "num_labels", path);
  if (num_labels <= 0 || num_labels > INT32_MAX)
    fail("classification file '", path, "' has num_labels ", num_labels, ", outside 1..2147483647; ",
         kRemake);
  info.num_labels = int(num_labels);
  info.label_names = read_label_names(file, path);
  if (info.label_names.size() != size_t(num_labels))
    fail("classification file '", path, "' has ", info.label_names.size(),
         " label_names but num_labels ", num_labels, "; ", kRemake);
  info.pad_id = require_int_attr(file, "pad_id", path);
  if (info.pad_id < 0 || info.pad_id >= info.vocab_size)
    fail("classification file '", path, "' has pad_id ", info.pad_id, ", not below its vocab_size ",
         info.vocab_size, "; ", kRemake);
  if (!read_string_attr(file, "tokenizer", info.tokenizer, path))
    fail("classification file '", path, "' has no 'tokenizer' attribute; ", kRemake);
  read_string_attr(file, "created_by", info.created_by, path);  // optional
  read_string_attr(file, kContentHashAttr, info.content_hash, path);  // optional (older files)

  // The datasets: input_ids fixes [N, L]; the others must agree with it.
  std::vector<hsize_t> ids_dims, dims;
  Id input_ids = open_dataset(file, kInputIds, path, ids_dims);
  if (ids_dims[1] < 1 || ids_dims[1] > hsize_t(INT32_MAX))
    fail("classification file '", path, "': 'input_ids' has shape ", shape_text(ids_dims),
         ", but seq_len (the second dimension) must be in 1..2147483647; ", kRemake);
  const auto check_shape = [&](const DatasetSpec& spec) {
    if (dims[0] != ids_dims[0] || (spec.rank == 2 && dims[1] != ids_dims[1]))
      fail("classification file '", path, "': '", spec.name, "' has shape ", shape_text(dims),
           ", but 'input_ids' has shape ", shape_text(ids_dims), "; input_ids, token_type_ids and "
           "attention_mask must all be [N, L] and labels [N] (damaged or wrongly made file; ",
           kRemake, ")");
  };
  Id token_type_ids = open_dataset(file, kTokenTypeIds, path, dims);
  check_shape(kTokenTypeIds);
  Id attention_mask = open_dataset(file, kAttentionMask, path, dims);
  check_shape(kAttentionMask);
  Id labels = open_dataset(file, kLabels, path, dims);
  check_shape(kLabels);
  info.n_examples = int64_t(ids_dims[0]);
  info.seq_len = int(ids_dims[1]);
  if (listed && (info.content_hash != listed->content_hash || info.n_examples != listed->tokens))
    fail("'", path, "' is not the file that '", ref.manifest_path(), "' names (it holds ", info.n_examples,
         " examples with content fnv1a64 ", info.content_hash.empty() ? "(none)" : info.content_hash,
         ", the manifest says ", listed->tokens, " and ", listed->content_hash,
         "): the data set was changed after llmpi-prep glue wrote it; rerun llmpi-prep glue");

  info_ = std::move(info);
  file_ = std::move(file);
  input_ids_ = std::move(input_ids);
  token_type_ids_ = std::move(token_type_ids);
  attention_mask_ = std::move(attention_mask);
  labels_ = std::move(labels);
}

void ClassificationReader::read(const std::vector<int64_t>& indices, ClassificationExamples& out) {
  if (!is_open())
    fail("ClassificationReader::read called before open(); open a classification file first");
  const std::string& path = info_.path;
  const int64_t N = info_.n_examples, L = info_.seq_len;
  for (int64_t i : indices)
    if (i < 0 || i >= N)
      fail("cannot read example ", i, " from classification file '", path, "': it has ", N,
           " examples (valid indices 0..", N - 1,
           "); the sampler or data split is larger than the file");

  // HDF5 returns a union of hyperslabs in file order, so read the distinct rows in ascending order,
  // with consecutive rows merged into one block, and then place them in the order asked for.
  std::vector<int64_t> rows(indices);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const hsize_t n_rows = rows.size();

  std::vector<int32_t> ids(n_rows * L), types(n_rows * L), mask(n_rows * L), labels(n_rows);
  const auto read_rows = [&](hid_t dset, const DatasetSpec& spec, int32_t* dst) {
    Id fspace(H5Dget_space(dset), H5Sclose);
    const hsize_t mdims[2] = {n_rows, hsize_t(L)};
    Id mspace(H5Screate_simple(spec.rank, mdims, nullptr), H5Sclose);
    bool ok = fspace.valid() && mspace.valid();
    for (size_t r = 0; ok && r < rows.size();) {
      size_t end = r + 1;
      while (end < rows.size() && rows[end] == rows[end - 1] + 1) end++;
      const hsize_t start[2] = {hsize_t(rows[r]), 0}, count[2] = {hsize_t(end - r), hsize_t(L)};
      ok = H5Sselect_hyperslab(fspace, r == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr,
                               count, nullptr) >= 0;
      r = end;
    }
    // Read as int32 whatever the file type (uint8 widens), so a bad value is reported as it is.
    if (!ok || H5Dread(dset, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, dst) < 0)
      fail("cannot read ", n_rows, " examples of '", spec.name, "' from classification file '", path,
           "': the file is damaged or truncated", h5::detail(), "; ", kRemake);
  };
  if (n_rows > 0) {
    read_rows(input_ids_, kInputIds, ids.data());
    read_rows(token_type_ids_, kTokenTypeIds, types.data());
    read_rows(attention_mask_, kAttentionMask, mask.data());
    read_rows(labels_, kLabels, labels.data());
  }

  BadValue bad = first_bad_value(ids.data(), types.data(), mask.data(), labels.data(), int64_t(n_rows),
                                 L, info_.vocab_size, info_.num_labels, rows.data());
  if (bad.kind != BadValue::kNone) {
    const char* fix =
        bad.kind == BadValue::kTokenId
            ? ": the file, its tokenizer and the model's vocabulary do not match; remake the file "
              "with `llmpi-prep glue` using the model's tokenizer"
            : "; the file is damaged or was not made by `llmpi-prep glue` (remake it with "
              "`llmpi-prep glue`)";
    fail("classification file '", path, "': ", describe_bad_value(bad, info_.vocab_size, info_.num_labels),
         fix);
  }

  out.seq_len = int(L);
  out.input_ids.resize(indices.size() * L);
  out.token_type_ids.resize(indices.size() * L);
  out.attention_mask.resize(indices.size() * L);
  out.labels.resize(indices.size());
  for (size_t k = 0; k < indices.size(); k++) {
    const size_t r = size_t(std::lower_bound(rows.begin(), rows.end(), indices[k]) - rows.begin());
    std::copy_n(ids.begin() + r * L, L, out.input_ids.begin() + k * L);
    std::copy_n(types.begin() + r * L, L, out.token_type_ids.begin() + k * L);
    std::copy_n(mask.begin() + r * L, L, out.attention_mask.begin() + k * L);
    out.labels[k] = labels[r];
  }
}

ClassificationInfo open_classification_file_info(const std::string& path) {
  ClassificationReader r(path);
  return r.info();
}

// ---- format probe ----------------------------------------------------------------------------

std::string hdf5_format_of(const std::string& path) {
  const std::string listed = manifest_format_of(path);  // a split of a data set directory
  if (!listed.empty()) return listed;
  h5::quiet();
  if (!h5::has_signature(path)) return "";
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl, true, true);
#endif
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!file.valid()) {
    h5::detail();  // clears HDF5's error stack
    return "";
  }
  std::string format;
  try {
    if (!h5::read_string_attr(file, "format", format, "'" + path + "'", "")) format.clear();
  } catch (const Error&) {
    format.clear();  // present but not a readable string: no format we know
  }
  h5::detail();
  return format;
}

}  // namespace llmpi
