// TensorBoard event files (the format and the contract: metrics/tensorboard.h).
#include "metrics/tensorboard.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "runtime/crc32c.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_fixed(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

// A field's key: (number << 3) | wire type (0 varint, 1 64-bit, 2 length-delimited, 5 32-bit).
void put_key(std::string& s, int field, int wire) { put_varint(s, static_cast<uint64_t>(field) << 3 | wire); }

void put_bytes(std::string& s, int field, const std::string& bytes) {
  put_key(s, field, 2);
  put_varint(s, bytes.size());
  s += bytes;
}

double system_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Reading: a cursor over one record's data.
struct Cursor {
  const std::string& s;
  size_t i = 0;
  const std::string& where;
  bool done() const { return i >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= s.size()) fail(where, ": a truncated varint");
      const uint8_t b = static_cast<uint8_t>(s[i++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(where, ": a varint longer than 10 bytes");
  }
  uint64_t fixed(int bytes) {
    if (i + bytes > s.size()) fail(where, ": a truncated fixed-size field");
    uint64_t v = 0;
    for (int k = 0; k < bytes; k++) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[i + k])) << (8 * k);
    i += bytes;
    return v;
  }
  std::string bytes() {
    const uint64_t n = varint();
    if (n > s.size() - i) fail(where, ": a truncated length-delimited field");
    std::string b = s.substr(i, n);
    i += n;
    return b;
  }
  void skip(int wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1: fixed(8); return;
      case 2: bytes(); return;
      case 5: fixed(4); return;
      default: fail(where, ": a field of wire type ", wire, ", which no event field here has");
    }
  }
};

template <typename T>
T bits_as(uint64_t v) {
  T x;
  if constexpr (sizeof(T) == 4) {
    const uint32_t u = static_cast<uint32_t>(v);
    std::memcpy(&x, &u, 4);
  } else {
    std::memcpy(&x, &v, 8);
  }
  return x;
}

TensorboardEvent decode_event(const std::string& data, const std::string& where) {
  TensorboardEvent e;
  Cursor c{data, 0, where};
  while (!c.done()) {
    const uint64_t key = c.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 1) e.wall_time = bits_as<double>(c.fixed(8));
    else if (field == 2 && wire == 0) e.step = static_cast<int64_t>(c.varint());
    else if (field == 3 && wire == 2) e.file_version = c.bytes();
    else if (field == 5 && wire == 2) {  // Summary
      const std::string summary = c.bytes();
      Cursor cs{summary, 0, where};
      while (!cs.done()) {
        const uint64_t k = cs.varint();
        if ((k >> 3) != 1 || (k & 7) != 2) {
          cs.skip(static_cast<int>(k & 7));
          continue;
        }
        const std::string value = cs.bytes();  // Value
        Cursor cv{value, 0, where};
        std::string tag;
        float v = 0;
        while (!cv.done()) {
          const uint64_t kv = cv.varint();
          if (kv >> 3 == 1 && (kv & 7) == 2) tag = cv.bytes();
          else if (kv >> 3 == 2 && (kv & 7) == 5) v = bits_as<float>(cv.fixed(4));
          else cv.skip(static_cast<int>(kv & 7));
        }
        e.values.emplace_back(tag, v);
      }
    } else if (field == 7 && wire == 2) {  // SessionLog
      const std::string log = c.bytes();
      Cursor cl{log, 0, where};
      while (!cl.done()) {
        const uint64_t k = cl.varint();
        if (k >> 3 == 1 && (k & 7) == 0) e.session_start = cl.varint() == 1;
        else cl.skip(static_cast<int>(k & 7));
      }
    } else {
      c.skip(wire);
    }
  }
  return e;
}

}  // namespace

std::string encode_tensorboard_event(const TensorboardEvent& e) {
  std::string s;
  uint64_t u = 0;
  if (e.wall_time != 0) {
    std::memcpy(&u, &e.wall_time, 8);
    put_key(s, 1, 1);
    put_fixed(s, u, 8);
  }
  if (e.step != 0) {
    put_key(s, 2, 0);
    put_varint(s, static_cast<uint64_t>(e.step));
  }
  if (!e.file_version.empty()) put_bytes(s, 3, e.file_version);
  if (!e.values.empty()) {
    std::string summary;
    for (const auto& [tag, value] : e.values) {
      std::string v;
      put_bytes(v, 1, tag);
      uint32_t b;
      std::memcpy(&b, &value, 4);
      put_key(v, 2, 5);
      put_fixed(v, b, 4);
      put_bytes(summary, 1, v);
    }
    put_bytes(s, 5, summary);
  }
  if (e.session_start) put_bytes(s, 7, std::string("\x08\x01", 2));  // status: START
  return s;
}

std::string tensorboard_record(const std::string& data) {
  std::string r;
  put_fixed(r, data.size(), 8);
  put_fixed(r, masked_crc(r.data(), 8), 4);
  r += data;
  put_fixed(r, masked_crc(data.data(), data.size()), 4);
  return r;
}

TensorboardWriter::TensorboardWriter(const std::string& dir, int64_t start_step, double (*wall_clock)())
    : clock_(wall_clock ? wall_clock : system_seconds) {
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  const std::string base = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(clock_())) + "." +
                           host + "." + std::to_string(getpid()) + ".llmpi";
  // A new file, never one that exists (two writers in one second of one process: a suffix).
  for (int k = 0; k < 1000 && !f_; k++) {
    path_ = k ? base + "." + std::to_string(k) : base;
    f_ = std::fopen(path_.c_str(), "wbx");
    if (!f_ && errno != EEXIST) break;
  }
  if (!f_)
    fail("cannot create the TensorBoard event file '", path_, "': ", std::strerror(errno),
         "; make run.dir writable, or set metrics.tensorboard false");
  TensorboardEvent version;
  version.wall_time = clock_();
  version.file_version = "brain.Event:2";
  write_event(encode_tensorboard_event(version));
  if (start_step > 0) {
    TensorboardEvent start;
    start.wall_time = clock_();
    start.step = start_step;
    start.session_start = true;
    write_event(encode_tensorboard_event(start));
  }
}

TensorboardWriter::~TensorboardWriter() {
  if (f_) std::fclose(f_);
}

void TensorboardWriter::write_event(const std::string& event) {
  const std::string r = tensorboard_record(event);
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size() || std::fflush(f_) != 0)
    fail("cannot write the TensorBoard event file '", path_, "': ", std::strerror(errno),
         "; free space on run.dir's file system, or set metrics.tensorboard false");
}

void TensorboardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  TensorboardEvent e;
  e.wall_time = clock_();
  e.step = step;
  for (const auto& [tag, v] : values) e.values.emplace_back(tag, static_cast<float>(v));
  write_event(encode_tensorboard_event(e));
}

std::vector<TensorboardEvent> read_tensorboard_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open the TensorBoard event file '", path, "'");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TensorboardEvent> events;
  size_t i = 0;
  for (int n = 0; i < all.size(); n++) {
    const std::string where = path + ", record " + std::to_string(n);
    if (all.size() - i < 12) fail(where, ": truncated (", all.size() - i, " bytes left of a 12-byte header)");
    uint64_t len = 0;
    for (int k = 0; k < 8; k++) len |= static_cast<uint64_t>(static_cast<uint8_t>(all[i + k])) << (8 * k);
    uint32_t crc = 0, dcrc = 0;
    for (int k = 0; k < 4; k++) crc |= static_cast<uint32_t>(static_cast<uint8_t>(all[i + 8 + k])) << (8 * k);
    if (crc != masked_crc(all.data() + i, 8)) fail(where, ": the length's CRC does not match (a damaged file)");
    if (len > all.size() - i - 12 || all.size() - i - 12 - len < 4)
      fail(where, ": truncated (", len, " bytes of data announced)");
    const std::string data = all.substr(i + 12, len);
    for (int k = 0; k < 4; k++)
      dcrc |= static_cast<uint32_t>(static_cast<uint8_t>(all[i + 12 + len + k])) << (8 * k);
    if (dcrc != masked_crc(data.data(), data.size())) fail(where, ": the data's CRC does not match (a damaged file)");
    events.push_back(decode_event(data, where));
    i += 12 + len + 4;
  }
  return events;
}

std::vector<std::string> tensorboard_files(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.find("tfevents") != std::string::npos) names.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace llmpi
