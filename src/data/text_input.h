// Streaming text input for llmpi-prep: the --input arguments divided into units of work, and the
// documents of one unit read one at a time from a plain file (from any offset), a gzip or zstd file
// (told by their first bytes, whatever the name) or standard input. Memory: a read buffer that
// grows to the longest line, and the current document.
//
// Documents:
//   text, blank-line  runs of non-blank lines (a blank line is empty or holds only " \t\r\f\v"); a
//                     document is its lines as they are in the input joined by "\n", without the
//                     line break after its last line (nor a "\r" just before that break)
//   text, file        the whole input is one document (skipped when it is only whitespace)
//   jsonl             one {"text": "..."} object per line; blank lines are skipped, and so are
//                     objects whose text is "" (counted as empty documents)
//
// Units: an uncompressed file larger than split_bytes whose documents can be found from any offset
// (jsonl, blank-line text) is divided into byte ranges of split_bytes. Unit k of such a file holds
// the documents whose first byte lies in [k * split_bytes, (k + 1) * split_bytes): its reader skips
// a document begun before the range (it looks back one line to know) and reads its last document
// past the range's end. So the documents of all units, in unit order, are the inputs' documents in
// order, whatever split_bytes is. Any other input (compressed, standard input, --split-docs file)
// is one unit.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmpi {

enum class InputFormat { text, jsonl };
enum class DocSplit { blank_line, file };

struct InputUnit {
  std::string path;              // "-" for standard input
  InputFormat format = InputFormat::text;
  bool compressed = false;       // gzip or zstd (read whole, as one unit)
  bool stream = false;           // standard input or a named pipe: read once, by the rank that sees it
  int64_t begin = 0, end = -1;   // a divided file's range (see above); end -1: to the end
  int64_t bytes = 0;             // the input bytes the unit covers (progress); 0 when unknown (stdin)
};

// Expand the --input arguments: "-" (standard input, at most once), glob patterns (each sorted by
// name; one that matches nothing is an Error), file names (a named pipe is a stream, like standard
// input). format: "auto" (jsonl for names ending in .jsonl or .JSONL, before a .gz/.zst suffix; text
// otherwise and for standard input), "text" or "jsonl". Errors name the input and the fix: missing,
// unreadable, a directory.
std::vector<InputUnit> plan_input_units(const std::vector<std::string>& inputs, const std::string& format,
                                        DocSplit split, int64_t split_bytes);

struct ByteStream;  // defined in text_input.cpp
struct LineReader;

// Reads one unit's documents in order. Errors (llmpi::Error) name the input: unreadable, damaged or
// truncated compressed data, a JSONL line that is not {"text": "..."} (by file and line number).
struct DocumentReader {
  DocumentReader(const InputUnit& unit, DocSplit split);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document's text, valid until the next call; false after the unit's last document.
  bool next(std::string_view& doc);
  int64_t empty_documents = 0;   // skipped: "" JSONL texts, whitespace-only whole files
  int64_t input_bytes() const;   // input read so far (compressed bytes for gzip / zstd; at most a range's)

 private:
  InputUnit unit_;
  DocSplit split_;
  std::unique_ptr<ByteStream> stream_;
  std::unique_ptr<LineReader> lines_;
  std::string doc_;
  bool done_ = false, skipping_ = false;
  int64_t line_no_ = 0;  // lines read in this unit (JSONL messages)
  int64_t line_number_at(int64_t offset) const;
};

}  // namespace llmpi
