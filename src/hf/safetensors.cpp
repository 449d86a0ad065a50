#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "data/h5_util.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

struct DtypeInfo {
  StDtype t;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::F64, "F64", 8},  {StDtype::F32, "F32", 4},         {StDtype::F16, "F16", 2},
    {StDtype::BF16, "BF16", 2}, {StDtype::I64, "I64", 8},         {StDtype::I32, "I32", 4},
    {StDtype::I16, "I16", 2},  {StDtype::I8, "I8", 1},           {StDtype::U8, "U8", 1},
    {StDtype::BOOL, "BOOL", 1}, {StDtype::F8_E4M3, "F8_E4M3", 1}, {StDtype::F8_E5M2, "F8_E5M2", 1},
};

bool parse_dtype(const std::string& s, StDtype& out) {
  for (const DtypeInfo& d : kDtypes)
    if (s == d.name) {
      out = d.t;
      return true;
    }
  return false;
}

// An IEEE half (1 sign, 5 exponent, 10 mantissa bits) as float, exactly (every half is a float).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // ±0
    } else {        // subnormal: mant × 2^-24, normalised for float
      int e = -1;
      uint32_t m = mant;
      do {
        e++;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;  // inf / NaN
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const char* st_dtype_name(StDtype t) {
  for (const DtypeInfo& d : kDtypes)
    if (d.t == t) return d.name;
  return "?";
}

size_t st_dtype_size(StDtype t) {
  for (const DtypeInfo& d : kDtypes)
    if (d.t == t) return d.size;
  return 0;
}

bool st_dtype_is_float(StDtype t) {
  return t == StDtype::F64 || t == StDtype::F32 || t == StDtype::F16 || t == StDtype::BF16;
}

size_t StTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

const StTensor* StHeader::find(const std::string& name) const {
  for (const StTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

StHeader parse_safetensors_header(const uint8_t* data, size_t file_size, const std::string& what) {
  const std::string fix = ": the file is not a valid safetensors file (re-save it with safetensors' save_file, "
                          "or transformers' save_pretrained)";
  if (file_size < 8) fail("'", what, "' is ", file_size, " bytes, too short for a safetensors header", fix);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
  if (n > file_size - 8)
    fail("'", what, "': its header length (", n, " bytes) runs past the end of the file (", file_size, " bytes)",
         fix);
  if (n < 2 || data[8] != '{')
    fail("'", what, "': the header does not start with a JSON object '{'", fix);
  StHeader h;
  h.data_start = 8 + static_cast<size_t>(n);
  const size_t data_size = file_size - h.data_start;
  const char* text = reinterpret_cast<const char*>(data + 8);
  nlohmann::json j = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail("'", what, "': the header is not a well-formed JSON object", fix);

  for (auto& [name, e] : j.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail("'", what, "': \"__metadata__\" must be an object of strings", fix);
      for (auto& [k, v] : e.items()) {
        if (!v.is_string()) fail("'", what, "': \"__metadata__\" value of \"", k, "\" is not a string", fix);
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "'" + what + "', tensor \"" + name + "\"";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(where, ": the entry must be an object with \"dtype\", \"shape\" and \"data_offsets\"", fix);
    StTensor t;
    t.name = name;
    const nlohmann::json &dt = e["dtype"], &sh = e["shape"], &off = e["data_offsets"];
    if (!dt.is_string()) fail(where, ": \"dtype\" must be a string", fix);
    if (!parse_dtype(dt.get<std::string>(), t.dtype))
      fail(where, ": unknown dtype \"", dt.get<std::string>(),
           "\" (known: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2); convert the "
           "checkpoint to float32, float16 or bfloat16");
    if (!sh.is_array()) fail(where, ": \"shape\" must be an array of sizes", fix);
    // numel × size must fit the data buffer, so no product can overflow unnoticed: check as we go.
    size_t bytes = st_dtype_size(t.dtype);
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) fail(where, ": \"shape\" holds ", d.dump(), ", not a size >= 0", fix);
      const uint64_t v = d.get<uint64_t>();
      t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max())));
      if (v != 0 && bytes > data_size / v) bytes = data_size + 1;  // too large: reported below
      else bytes *= v;
    }
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where, ": \"data_offsets\" must be [begin, end], two byte offsets >= 0", fix);
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      fail(where, ": data_offsets [", b, ", ", en, "] are outside the data buffer [0, ", data_size,
           "] (the file is truncated or the header is wrong)", fix);
    if (en - b != bytes) {
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      fail(where, ": shape [", shape, "] of ", st_dtype_name(t.dtype), " needs ",
           bytes > data_size ? std::string("more bytes than the file holds") : std::to_string(bytes) + " bytes",
           " but data_offsets [", b, ", ", en, "] hold ", en - b, fix);
    }
    t.begin = h.data_start + static_cast<size_t>(b);
    t.end = h.data_start + static_cast<size_t>(en);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); i++) {
    const StTensor &p = h.tensors[i - 1], &t = h.tensors[i];
    if (t.begin < p.end)
      fail("'", what, "': tensors \"", p.name, "\" and \"", t.name, "\" overlap (bytes [", p.begin - h.data_start,
           ", ", p.end - h.data_start, ") and [", t.begin - h.data_start, ", ", t.end - h.data_start, "))", fix);
  }
  return h;
}

void st_to_float(StDtype t, const uint8_t* src, size_t n, float* out) {
  if (n == 0 && st_dtype_is_float(t)) return;  // an empty tensor: out may be null (memcpy's is not allowed to be)
  switch (t) {
    case StDtype::F32:
      std::memcpy(out, src, n * 4);
      return;
    case StDtype::F64:
      for (size_t i = 0; i < n; i++) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return;
    case StDtype::F16:
      for (size_t i = 0; i < n; i++) out[i] = half_to_float(static_cast<uint16_t>(src[2 * i] | src[2 * i + 1] << 8));
      return;
    case StDtype::BF16:  // the upper half of a float's bits
      for (size_t i = 0; i < n; i++) {
        const uint32_t bits = static_cast<uint32_t>(src[2 * i] | src[2 * i + 1] << 8) << 16;
        std::memcpy(out + i, &bits, 4);
      }
      return;
    default:
      fail("safetensors: dtype ", st_dtype_name(t), " cannot be read as float parameters");
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno), "; check the path");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("'", path, "' is not a regular file; give the path of a .safetensors file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail("cannot map '", path, "' into memory: ", std::strerror(e));
    }
    map_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  try {
    static const uint8_t empty[1] = {0};
    header_ = parse_safetensors_header(map_ ? map_ : empty, size_, path);
  } catch (...) {
    if (map_) munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), size_);
}

void SafetensorsFile::read_float(const StTensor& t, float* out) const {
  if (!st_dtype_is_float(t.dtype))
    fail("'", path_, "', tensor \"", t.name, "\": dtype ", st_dtype_name(t.dtype),
         " cannot be read as float parameters (F32, F16, BF16 or F64 expected)");
  st_to_float(t.dtype, map_ + t.begin, t.numel(), out);
}

namespace {

size_t numel_of(const StWriteTensor& t) {
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

// The 8-byte length and the JSON header (padded to 8 bytes) of a file holding these tensors.
std::string safetensors_header(const std::vector<StWriteTensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> seen;
  size_t offset = 0;
  for (const StWriteTensor& t : tensors) {
    if (t.name == "__metadata__" || !seen.insert(t.name).second)
      fail("safetensors: tensor name \"", t.name, "\" is reserved or given twice");
    for (int64_t d : t.shape)
      if (d < 0) fail("safetensors: tensor \"", t.name, "\" has a negative dimension");
    const size_t n = numel_of(t);
    if (n > 0 && !t.data && !t.fill) fail("internal: safetensors tensor \"", t.name, "\" has neither data nor fill");
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * n}}};
    offset += 4 * n;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t len = header.size();
  for (int i = 0; i < 8; i++) out[i] = static_cast<char>(len >> (8 * i) & 0xff);
  return out + header;
}

// Calls put(bytes, count) with each tensor's values in turn: its data, or what its fill writes
// into a buffer of its own size (one tensor's worth at a time).
template <class Put>
void each_tensor_bytes(const std::vector<StWriteTensor>& tensors, Put put) {
  std::vector<float> buf;
  for (const StWriteTensor& t : tensors) {
    const size_t n = numel_of(t);
    if (n == 0) continue;
    const float* v = t.data;
    if (!v) {
      buf.assign(n, 0.0f);
      t.fill(buf.data());
      v = buf.data();
    }
    put(reinterpret_cast<const char*>(v), 4 * n);  // little-endian hosts (x86-64, aarch64)
  }
}

}  // namespace

std::string safetensors_bytes(const std::vector<StWriteTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string out = safetensors_header(tensors, metadata);
  each_tensor_bytes(tensors, [&](const char* p, size_t n) { out.append(p, n); });
  return out;
}

void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  const std::string tmp = path + ".tmp";
  h5::TmpFileGuard guard{tmp};
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write '", tmp, "': ", std::strerror(errno), "; check that the directory exists and is writable");
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    each_tensor_bytes(tensors, [&](const char* p, size_t n) { out.write(p, static_cast<std::streamsize>(n)); });
    out.flush();
    if (!out) fail("writing '", tmp, "' failed (", std::strerror(errno), "); is the disk full?");
  }
  h5::commit_tmp_file(tmp, path, guard);
}

}  // namespace llmpi
