// libFuzzer target: llmpi's own token file checks (TokenReader::open / read), on well-formed HDF5
// files whose contents the input chooses.
//
// token_file_fuzz feeds raw bytes, so most of its time goes into libhdf5's binary parser. This
// target instead builds a valid HDF5 file with the HDF5 API from choices read off the input: each
// root attribute (format, version, vocab_size, eot_id, tokenizer, created_by) absent or of any
// kind (integers of every width and sign, doubles, fixed and variable-length strings with odd
// padding and bytes, arrays, empty and null dataspaces), and `tokens` absent, a group, or a dataset
// of any type, rank, shape, layout and values. Then it opens the file as token_file_fuzz does.
// Contract: only llmpi::Error may escape; a file that opens describes itself consistently and
// every token read is < vocab_size.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "token_file_checks.h"
#include "runtime/error.h"

namespace {

std::string g_path;
const bool g_verbose = std::getenv("LLMPI_FUZZ_VERBOSE") != nullptr;  // print each outcome

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "token_header_fuzz: %s\n", what.c_str());
  std::abort();
}

void remove_tmp() {
  if (!g_path.empty()) std::remove(g_path.c_str());
}

// Owning hid_t for this file only (the library's wrapper may change under us).
struct H {
  hid_t id;
  herr_t (*close)(hid_t);
  H(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H() {
    if (id >= 0) close(id);
  }
  operator hid_t() const { return id; }
};

int64_t pick_int(FuzzedDataProvider& in) {
  static const int64_t menu[] = {0, 1, -1, 2, 255, 256, 257, 65535, 65536, 50256, 50257,
                                 INT32_MAX, int64_t(INT32_MAX) + 1, INT64_MAX, INT64_MIN};
  if (in.ConsumeBool()) return in.PickValueInArray(menu);
  return in.ConsumeIntegral<int64_t>();
}

std::string pick_string(FuzzedDataProvider& in, const char* name) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return std::string(name) == "format" ? "llmpi-tokens" : "byte";
    case 1: return "";
    default: return in.ConsumeRandomLengthString(64);
  }
}

hid_t pick_int_type(FuzzedDataProvider& in) {
  const hid_t types[] = {H5T_STD_I8LE,  H5T_STD_U8LE,  H5T_STD_I16LE, H5T_STD_U16BE, H5T_STD_I32LE,
                         H5T_STD_U32LE, H5T_STD_I64BE, H5T_STD_I64LE, H5T_STD_U64LE};
  return types[in.ConsumeIntegralInRange<size_t>(0, sizeof types / sizeof types[0] - 1)];
}

// A dataspace: scalar, null, or 1-D of 0..3 elements.
hid_t pick_space(FuzzedDataProvider& in, hsize_t& n) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: n = 0; return H5Screate(H5S_NULL);
    case 1: {
      n = in.ConsumeIntegralInRange<hsize_t>(0, 3);
      return H5Screate_simple(1, &n, nullptr);
    }
    default: n = 1; return H5Screate(H5S_SCALAR);
  }
}

void write_attr(hid_t file, FuzzedDataProvider& in, const char* name) {
  const std::string nm = name;
  // Choice 0 (also what an exhausted input gives) is what llmpi-prep writes, with a value that
  // may still be wrong; the others are anything at all.
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    H space(H5Screate(H5S_SCALAR), H5Sclose);
    if (nm == "version" || nm == "vocab_size" || nm == "eot_id") {
      int64_t v = nm == "version" ? (in.ConsumeBool() ? 1 : pick_int(in)) : pick_int(in);
      if (nm == "vocab_size" && v == 0) v = 257;
      if (nm == "eot_id" && v == 0) v = 256;
      H a(H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      H5Awrite(a, H5T_NATIVE_INT64, &v);
    } else {
      H t(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(t, H5T_VARIABLE);
      H5Tset_cset(t, H5T_CSET_UTF8);
      std::string v = in.ConsumeBool() ? (nm == "format" ? "llmpi-tokens" : "byte") : pick_string(in, name);
      const char* p = v.c_str();
      H a(H5Acreate2(file, name, t, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      H5Awrite(a, t, &p);
    }
    return;
  }
  const int kind = in.ConsumeIntegralInRange<int>(0, 5);
  if (kind == 0) return;  // absent
  hsize_t n = 1;
  H space(pick_space(in, n), H5Sclose);
  const size_t count = std::max<hsize_t>(n, 1);
  if (kind == 1) {  // integer of some width; values written from int64
    hid_t ftype = pick_int_type(in);
    std::vector<int64_t> v(count);
    for (auto& x : v) x = pick_int(in);
    H a(H5Acreate2(file, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a.id >= 0) H5Awrite(a, H5T_NATIVE_INT64, v.data());
  } else if (kind == 2) {  // double
    std::vector<double> v(count);
    for (auto& x : v) x = in.ConsumeBool() ? double(pick_int(in)) : in.ConsumeFloatingPoint<double>();
    H a(H5Acreate2(file, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a.id >= 0) H5Awrite(a, H5T_NATIVE_DOUBLE, v.data());
  } else if (kind == 3) {  // variable-length string
    H t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, in.ConsumeBool() ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    std::vector<std::string> s(count);
    std::vector<const char*> p(count);
    for (size_t i = 0; i < count; i++) {
      s[i] = pick_string(in, name);
      p[i] = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? nullptr : s[i].c_str();
    }
    H a(H5Acreate2(file, name, t, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a.id >= 0) H5Awrite(a, t, p.data());
  } else if (kind == 4) {  // fixed-length string, any padding, any bytes
    const std::string s = pick_string(in, name);
    const size_t len = in.ConsumeBool() ? std::max<size_t>(s.size(), 1) : in.ConsumeIntegralInRange<size_t>(1, 80);
    H t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t, len);
    static const H5T_str_t pads[] = {H5T_STR_NULLTERM, H5T_STR_NULLPAD, H5T_STR_SPACEPAD};
    H5Tset_strpad(t, in.PickValueInArray(pads));
    std::string buf(len * count, '\0');
    for (size_t i = 0; i < count; i++) std::copy_n(s.begin(), std::min(len, s.size()), buf.begin() + i * len);
    H a(H5Acreate2(file, name, t, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a.id >= 0) H5Awrite(a, t, buf.data());
  } else {  // something else entirely: a float32 or an opaque blob
    float f = in.ConsumeFloatingPoint<float>();
    std::vector<float> v(count, f);
    H a(H5Acreate2(file, name, H5T_IEEE_F32BE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a.id >= 0) H5Awrite(a, H5T_NATIVE_FLOAT, v.data());
  }
}

void write_tokens(hid_t file, FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {  // 0 (and an exhausted input): a dataset
    case 1: return;  // absent
    case 2: H5Gclose(H5Gcreate2(file, "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)); return;
    case 3: H5Lcreate_soft("/nowhere", file, "tokens", H5P_DEFAULT, H5P_DEFAULT); return;
    default: break;
  }
  const hid_t types[] = {H5T_STD_U16LE, H5T_STD_U32LE, H5T_STD_U16BE, H5T_STD_U32BE, H5T_STD_U8LE,
                         H5T_STD_I16LE, H5T_STD_I32LE, H5T_STD_U64LE, H5T_IEEE_F32LE, H5T_C_S1};
  const size_t ti = in.ConsumeIntegralInRange<size_t>(0, 2 * (sizeof types / sizeof types[0]) - 1);
  const hid_t ftype = types[ti < sizeof types / sizeof types[0] ? ti : ti % 2];  // mostly uint16/32
  const int rank = in.ConsumeIntegralInRange<int>(0, 9) == 9 ? in.ConsumeIntegralInRange<int>(0, 2) : 1;
  hsize_t dims[2] = {in.ConsumeIntegralInRange<hsize_t>(0, 300), in.ConsumeIntegralInRange<hsize_t>(0, 3)};
  const bool unlimited = in.ConsumeBool();
  hsize_t maxdims[2] = {unlimited ? H5S_UNLIMITED : dims[0], unlimited ? H5S_UNLIMITED : dims[1]};
  H space(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, maxdims), H5Sclose);
  H dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const int layout = in.ConsumeIntegralInRange<int>(0, 2);
  if (rank > 0 && (layout == 1 || unlimited)) {
    hsize_t chunk[2] = {in.ConsumeIntegralInRange<hsize_t>(1, 512), in.ConsumeIntegralInRange<hsize_t>(1, 4)};
    H5Pset_chunk(dcpl, rank, chunk);
    if (in.ConsumeBool()) H5Pset_deflate(dcpl, 1);
  } else if (layout == 2) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  }
  if (in.ConsumeBool()) {
    uint32_t fill = in.ConsumeIntegral<uint32_t>();
    H5Pset_fill_value(dcpl, H5T_NATIVE_UINT32, &fill);
  }
  H d(H5Dcreate2(file, "tokens", ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (d.id < 0) return;
  hssize_t npoints = H5Sget_simple_extent_npoints(space);
  if (npoints <= 0 || in.ConsumeIntegralInRange<int>(0, 7) == 0) return;  // never written: fill value
  std::vector<uint32_t> v(static_cast<size_t>(npoints));
  for (auto& x : v) x = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 300) : in.ConsumeIntegral<uint32_t>();
  if (ftype != H5T_C_S1) H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const char* t = std::getenv("TMPDIR");
  g_path = std::string(t && *t ? t : "/tmp") + "/llmpi-token-header-fuzz-" + std::to_string(getpid()) + ".h5";
  std::atexit(remove_tmp);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    H file(H5Fcreate(g_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (file.id < 0) bug("cannot create " + g_path);
    const bool tokens_first = in.ConsumeBool();
    if (tokens_first) write_tokens(file, in);
    for (const char* name : {"format", "version", "vocab_size", "eot_id", "tokenizer", "created_by"})
      write_attr(file, in, name);
    if (!tokens_first) write_tokens(file, in);
  }
  try {
    llmpi::TokenReader r(g_path);
    fuzz_checks::check_info("token_header_fuzz", r.info());
    const int64_t n = r.n_tokens();
    fuzz_checks::read_some("token_header_fuzz", r, 0, std::min<int64_t>(n, 4096));
    fuzz_checks::read_some("token_header_fuzz", r, std::max<int64_t>(0, n - 16), std::min<int64_t>(n, 16));
    fuzz_checks::read_some("token_header_fuzz", r, n, 1);  // out of range: an Error
    fuzz_checks::read_some("token_header_fuzz", r, -1, 2);
    r.close();
    if (g_verbose) std::fprintf(stderr, "opened: %lld tokens\n", (long long)n);
  } catch (const llmpi::Error& e) {
    if (g_verbose) std::fprintf(stderr, "Error: %s\n", e.what());
  }
  return 0;
}
