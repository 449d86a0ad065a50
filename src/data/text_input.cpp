// Streaming text input for llmpi-prep. Contract: text_input.h.
#include "data/text_input.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "data/path_util.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

enum class Codec { none, gzip, zstd };

constexpr size_t kReadBytes = size_t(1) << 18;  // bytes per read() of the input
constexpr size_t kLineBytes = size_t(1) << 16;  // the line buffer's first size (it grows)

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

Codec codec_of(const unsigned char* p, size_t n) {
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) return Codec::gzip;
  if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd) return Codec::zstd;
  return Codec::none;
}

std::string strip_compression_suffix(const std::string& name) {
  for (const char* s : {".gz", ".gzip", ".zst", ".zstd"})
    if (ends_with(name, s)) return name.substr(0, name.size() - std::strlen(s));
  return name;
}

}  // namespace

// ---- byte streams --------------------------------------------------------------------------------

// A file (or standard input) from an offset, decompressed when it starts with a gzip or zstd magic.
struct ByteStream {
  std::string path;  // for messages
  int fd = -1;
  bool own_fd = false;
  Codec codec = Codec::none;
  std::unique_ptr<char[]> in_buf{new char[kReadBytes]};  // not zeroed: a unit may be a few bytes
  char* in = in_buf.get();
  size_t in_pos = 0, in_len = 0;
  bool in_eof = false;
  int64_t consumed = 0;  // bytes read from fd
  z_stream z{};
  bool z_ready = false;
  ZSTD_DStream* zs = nullptr;
  size_t zs_hint = 0;  // 0: between zstd frames

  ByteStream(const std::string& p, int64_t offset) : path(p) {
    if (p == "-") {
      fd = 0;
    } else {
      fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail("cannot read input '", p, "': ", std::strerror(errno), "; check the path");
      own_fd = true;
      if (offset > 0 && ::lseek(fd, off_t(offset), SEEK_SET) < 0)
        fail("cannot seek in input '", p, "': ", std::strerror(errno));
    }
    if (offset > 0) return;  // the middle of a plain file
    while (in_len < 4 && fill_more()) {
    }
    codec = codec_of(reinterpret_cast<const unsigned char*>(in), in_len);
    if (codec == Codec::gzip) {
      if (inflateInit2(&z, 15 + 32) != Z_OK) fail("cannot start gzip decompression of '", p, "'");
      z_ready = true;
    } else if (codec == Codec::zstd) {
      zs = ZSTD_createDStream();
      if (!zs || ZSTD_isError(ZSTD_initDStream(zs))) fail("cannot start zstd decompression of '", p, "'");
    }
  }
  ~ByteStream() {
    if (z_ready) inflateEnd(&z);
    if (zs) ZSTD_freeDStream(zs);
    if (own_fd) ::close(fd);
  }
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // Read more raw bytes after those in `in` (compacting it first); false at the end of the file.
  bool fill_more() {
    if (in_eof) return false;
    if (in_pos > 0) {
      std::memmove(in, in + in_pos, in_len - in_pos);
      in_len -= in_pos;
      in_pos = 0;
    }
    ssize_t n;
    do n = ::read(fd, in + in_len, kReadBytes - in_len);
    while (n < 0 && errno == EINTR);
    if (n < 0) fail("cannot read input '", path, "': ", std::strerror(errno));
    if (n == 0) in_eof = true;
    in_len += size_t(n);
    consumed += n;
    return n > 0;
  }

  // Up to cap bytes of (decompressed) input; 0 at its end.
  size_t read(char* out, size_t cap) {
    for (;;) {
      if (in_pos == in_len && !fill_more()) {
        if (codec == Codec::zstd && zs_hint != 0)
          fail("input '", path, "' ends inside a zstd frame: the file is truncated; check it (zstd -t)");
        if (codec == Codec::gzip && z_ready && z.total_in > 0)
          fail("input '", path, "' ends inside gzip data: the file is truncated; check it (gzip -t)");
        return 0;
      }
      if (codec == Codec::none) {
        const size_t n = std::min(cap, in_len - in_pos);
        std::memcpy(out, in + in_pos, n);
        in_pos += n;
        return n;
      }
      if (codec == Codec::gzip) {
        z.next_in = reinterpret_cast<Bytef*>(in + in_pos);
        z.avail_in = uInt(in_len - in_pos);
        z.next_out = reinterpret_cast<Bytef*>(out);
        z.avail_out = uInt(std::min(cap, size_t(1) << 30));
        const int rc = inflate(&z, Z_NO_FLUSH);
        in_pos = in_len - z.avail_in;
        const size_t produced = size_t(reinterpret_cast<char*>(z.next_out) - out);
        if (rc == Z_STREAM_END) {
          inflateReset(&z);  // the next gzip member, if any; total_in 0 marks "between members"
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
          fail("input '", path, "' is not valid gzip data (zlib: ", z.msg ? z.msg : "error ", rc,
               "); check it (gzip -t)");
        }
        if (produced > 0) return produced;
        continue;
      }
      ZSTD_inBuffer src{in + in_pos, in_len - in_pos, 0};
      ZSTD_outBuffer dst{out, cap, 0};
      zs_hint = ZSTD_decompressStream(zs, &dst, &src);
      if (ZSTD_isError(zs_hint))
        fail("input '", path, "' is not valid zstd data (", ZSTD_getErrorName(zs_hint), "); check it (zstd -t)");
      in_pos += src.pos;
      if (dst.pos > 0) return dst.pos;
    }
  }
};

// Lines of a ByteStream, each without its "\n", with the offset where it starts.
struct LineReader {
  ByteStream& src;
  std::vector<char> buf = std::vector<char>(kLineBytes);
  size_t pos = 0, len = 0;
  bool eof = false;
  int64_t origin = 0;  // input offset of buf[0]

  LineReader(ByteStream& s, int64_t offset) : src(s), origin(offset) {}

  // The next line (a view into buf, valid until the next call) and its offset; false at the end.
  bool next(std::string_view& line, int64_t& start) {
    for (;;) {
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + pos, '\n', len - pos));
      if (nl) {
        const size_t end = size_t(nl - buf.data());
        line = std::string_view(buf.data() + pos, end - pos);
        start = origin + int64_t(pos);
        pos = end + 1;
        return true;
      }
      if (eof) {
        if (pos == len) return false;
        line = std::string_view(buf.data() + pos, len - pos);
        start = origin + int64_t(pos);
        pos = len;
        return true;
      }
      if (pos > 0) {
        std::memmove(buf.data(), buf.data() + pos, len - pos);
        origin += int64_t(pos);
        len -= pos;
        pos = 0;
      }
      if (len == buf.size()) buf.resize(buf.size() * 2);
      const size_t n = src.read(buf.data() + len, buf.size() - len);
      if (n == 0) eof = true;
      len += n;
    }
  }
  int64_t offset() const { return origin + int64_t(pos); }  // where the next line starts
};

namespace {

// Is the line that ends just before `line_start` (a line start > 0, after a "\n") blank?
bool line_before_is_blank(const std::string& path, int64_t line_start) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot read input '", path, "': ", std::strerror(errno), "; check the path");
  char buf[65536];
  int64_t end = line_start - 1;  // the "\n" that ends the previous line
  bool blank = true, found = false;
  while (end > 0 && !found) {
    const int64_t begin = std::max<int64_t>(0, end - int64_t(sizeof buf));
    const ssize_t n = ::pread(fd, buf, size_t(end - begin), off_t(begin));
    if (n != ssize_t(end - begin)) {
      ::close(fd);
      fail("cannot read input '", path, "' at byte ", begin, "; check the file");
    }
    for (int64_t i = n - 1; i >= 0 && !found; i--) {
      const char c = buf[i];
      if (c == '\n') found = true;
      else if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') blank = false, found = true;
    }
    end = begin;
  }
  ::close(fd);
  return blank;
}

}  // namespace

// ---- units ---------------------------------------------------------------------------------------

std::vector<InputUnit> plan_input_units(const std::vector<std::string>& inputs, const std::string& format,
                                        DocSplit split, int64_t split_bytes) {
  std::vector<std::string> paths;
  bool have_stdin = false;
  for (const std::string& arg : inputs) {
    if (arg == "-") {
      if (have_stdin) fail("--input - is given twice; standard input can be read once");
      have_stdin = true;
      paths.push_back(arg);
    } else if (arg.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = ::glob(arg.c_str(), GLOB_NOSORT, nullptr, &g);
      if (rc == GLOB_NOMATCH)
        fail("--input '", arg, "' matches no file; check the pattern");
      if (rc != 0) {
        globfree(&g);
        fail("cannot expand --input '", arg, "' (glob error ", rc, "); check the pattern and the permissions");
      }
      std::vector<std::string> found(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      globfree(&g);
      std::sort(found.begin(), found.end());
      paths.insert(paths.end(), found.begin(), found.end());
    } else {
      paths.push_back(arg);
    }
  }

  std::vector<InputUnit> units;
  for (const std::string& path : paths) {
    InputUnit u;
    u.path = path;
    const std::string name = strip_compression_suffix(path);
    u.format = format == "jsonl" ? InputFormat::jsonl
               : format == "text" ? InputFormat::text
               : path != "-" && (ends_with(name, ".jsonl") || ends_with(name, ".JSONL")) ? InputFormat::jsonl
                                                                                          : InputFormat::text;
    if (path == "-") {
      u.stream = true;
      units.push_back(u);
      continue;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      fail("cannot read input '", path, "': ", std::strerror(errno), "; check the path");
    if (S_ISDIR(st.st_mode))
      fail("input '", path, "' is a directory; give the files inside it (--input '", path, "/*.txt')");
    if (!S_ISREG(st.st_mode)) {  // a named pipe or a device: read once, where it is opened
      u.stream = true;
      units.push_back(u);
      continue;
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot read input '", path, "': ", std::strerror(errno), "; check its permissions");
    unsigned char magic[4];
    const ssize_t n = ::read(fd, magic, sizeof magic);
    ::close(fd);
    u.compressed = n > 0 && codec_of(magic, size_t(n)) != Codec::none;
    u.bytes = int64_t(st.st_size);
    const bool divisible = !u.compressed && !(u.format == InputFormat::text && split == DocSplit::file);
    if (!divisible || u.bytes <= split_bytes) {
      units.push_back(u);
      continue;
    }
    for (int64_t b = 0; b < u.bytes; b += split_bytes) {
      InputUnit r = u;
      r.begin = b;
      r.end = b + split_bytes;
      r.bytes = std::min(split_bytes, u.bytes - b);
      units.push_back(r);
    }
  }
  return units;
}

// ---- documents -----------------------------------------------------------------------------------

DocumentReader::DocumentReader(const InputUnit& unit, DocSplit split) : unit_(unit), split_(split) {
  const int64_t start = unit.begin > 0 ? unit.begin - 1 : 0;
  stream_ = std::make_unique<ByteStream>(unit.path, start);
  lines_ = std::make_unique<LineReader>(*stream_, start);
  if (unit.begin > 0) {
    // Skip to the first line that starts at or after `begin` (the byte before it ends a line).
    std::string_view line;
    int64_t at = 0;
    if (!lines_->next(line, at)) {
      done_ = true;
      return;
    }
    if (unit.format == InputFormat::text) skipping_ = !line_before_is_blank(unit.path, lines_->offset());
  }
}

DocumentReader::~DocumentReader() = default;

int64_t DocumentReader::input_bytes() const {
  // A range's reader reads ahead past the range's end; count the range's bytes only.
  return unit_.end >= 0 ? std::min(stream_->consumed, unit_.bytes) : stream_->consumed;
}

int64_t DocumentReader::line_number_at(int64_t offset) const {
  if (unit_.begin == 0) return line_no_;
  // A range of a file: count the lines before it.
  const int fd = ::open(unit_.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  int64_t lines = 1;
  char buf[65536];
  for (int64_t at = 0; at < offset;) {
    const ssize_t n = ::pread(fd, buf, size_t(std::min<int64_t>(sizeof buf, offset - at)), off_t(at));
    if (n <= 0) break;
    lines += std::count(buf, buf + n, '\n');
    at += n;
  }
  ::close(fd);
  return lines;
}

bool DocumentReader::next(std::string_view& doc) {
  if (done_) return false;
  std::string_view line;
  int64_t start = 0;

  if (unit_.format == InputFormat::text && split_ == DocSplit::file) {  // the whole input, once
    done_ = true;
    doc_.clear();
    std::vector<char> buf(kReadBytes);
    for (size_t n; (n = stream_->read(buf.data(), buf.size())) > 0;) doc_.append(buf.data(), n);
    if (doc_.find_first_not_of(" \t\r\n\f\v") == std::string::npos) {
      empty_documents++;
      return false;
    }
    doc = doc_;
    return true;
  }

  if (unit_.format == InputFormat::jsonl) {
    while (lines_->next(line, start)) {
      if (unit_.end >= 0 && start >= unit_.end) break;
      line_no_++;
      if (is_blank(line)) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line.begin(), line.end());
      } catch (const nlohmann::json::exception& e) {
        fail(unit_.path, ":", line_number_at(start), ": not valid JSON (", e.what(),
             "); each line of a JSONL input must be one {\"text\": ...} object");
      }
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
        fail(unit_.path, ":", line_number_at(start), ": expected an object with a string \"text\" field, like "
             "{\"text\": \"...\"}; fix the line or use --input-format text");
      doc_ = j["text"].get<std::string>();
      if (doc_.empty()) {
        empty_documents++;
        continue;
      }
      doc = doc_;
      return true;
    }
    done_ = true;
    return false;
  }

  // Blank-line separated text.
  bool in_doc = false, last_cr = false;
  while (lines_->next(line, start)) {
    const bool blank = is_blank(line);
    if (skipping_) {  // the rest of a document that began before this unit's range
      skipping_ = !blank;
      continue;
    }
    if (!blank) {
      if (!in_doc) {
        if (unit_.end >= 0 && start >= unit_.end) break;  // the next unit's document
        in_doc = true;
        doc_.assign(line);
      } else {
        doc_ += '\n';
        doc_ += line;
      }
      last_cr = line.back() == '\r';
    } else if (in_doc) {
      if (last_cr) doc_.pop_back();
      doc = doc_;
      return true;
    } else if (unit_.end >= 0 && start >= unit_.end) {
      break;
    }
  }
  done_ = true;
  if (!in_doc) return false;
  if (last_cr) doc_.pop_back();
  doc = doc_;
  return true;
}

}  // namespace llmpi
