// safetensors files (Hugging Face's weight format), read and written by our own small code.
//
//   bytes 0..7      N, the header length, unsigned 64-bit little-endian
//   bytes 8..8+N    a JSON object (UTF-8, may be padded with trailing spaces):
//                     "NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
//                     "__metadata__": {"key": "string value", ...}          (optional)
//   bytes 8+N..     the data buffer; a tensor's bytes are [8+N+begin, 8+N+end), row-major,
//                   little-endian, end - begin = numel × the dtype's size
//
// The reader maps the file (mmap) and validates the whole header before anything is read: a
// header that is not a JSON object, a tensor entry with missing or mistyped fields, a dtype we do
// not know, a shape whose size does not match its byte range, a range outside the file, or two
// tensors whose bytes overlap are errors that name the file, the tensor and the problem. Only the
// pages of the tensors actually read are touched, so a rank that needs a few tensors of a large
// file reads only those.
//
// Values: F32, F16 and BF16 (and F64) are converted to float on read; integer and bool tensors
// (e.g. BERT's position_ids buffer) are listed but cannot be read as parameters.
//
// The writer writes F32 tensors in the order given, the header padded with spaces to a multiple
// of 8 bytes, atomically (NAME.tmp, fsync, rename: see h5::commit_tmp_file).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace llmpi {

enum class StDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

const char* st_dtype_name(StDtype t);
size_t st_dtype_size(StDtype t);
bool st_dtype_is_float(StDtype t);  // F64, F32, F16, BF16: convertible to float

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte range in the FILE (8 + N + data_offsets)
  size_t numel() const;
};

// The parsed, validated header of a safetensors image of `file_size` bytes whose first bytes are
// `data` (at least the 8 + N header bytes must be present). `what` names the file in messages.
struct StHeader {
  std::vector<StTensor> tensors;                 // in the order of their data offsets
  std::map<std::string, std::string> metadata;  // "__metadata__"
  size_t data_start = 0;                         // 8 + N
  const StTensor* find(const std::string& name) const;
};
StHeader parse_safetensors_header(const uint8_t* data, size_t file_size, const std::string& what);

// Convert n values of a float dtype at src (little-endian bytes) to float. Throws for a
// non-float dtype.
void st_to_float(StDtype t, const uint8_t* src, size_t n, float* out);

// A safetensors file, memory-mapped read-only.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates; throws Error
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const StHeader& header() const { return header_; }
  const std::vector<StTensor>& tensors() const { return header_.tensors; }
  const StTensor* find(const std::string& name) const { return header_.find(name); }
  // The tensor's values as float (n = numel floats at out). Throws for integer dtypes.
  void read_float(const StTensor& t, float* out) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  StHeader header_;
};

struct StWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;          // numel floats, or
  std::function<void(float*)> fill;     // (data null) writes the numel floats, called once when written
};

// The bytes of a safetensors file holding these F32 tensors (names must be unique).
std::string safetensors_bytes(const std::vector<StWriteTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// Write them to path atomically, one tensor at a time (a fill's buffer: the largest tensor).
void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace llmpi
