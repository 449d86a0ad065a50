// llmpi-prep: turn text / JSONL into HDF5 token files (DIR/train.h5, DIR/val.h5), and inspect
// token files. Serial; needs no MPI_Init.
//
//   llmpi-prep --tokenizer byte|gpt2|hf:PATH|wordpiece:PATH [--gpt2-encoder P --gpt2-merges P]
//              [--lowercase] --input FILE...
//              --out DIR [--val-fraction 0.05] [--input-format auto|text|jsonl]
//              [--split-docs blank-line|file] [--seed N] [--allow-special]
//   llmpi-prep inspect FILE [--show N] [--gpt2-encoder P --gpt2-merges P]
//   llmpi-prep glue --task rte --data-dir DIR --tokenizer hf:PATH|wordpiece:PATH [--lowercase]
//              [--max-seq-len 128] --out DIR        (data/glue.h: GLUE TSVs to classification files)
//
// Preparing runs in three steps, so that bad input fails before anything is written:
//   1. read every input and cut it into documents (text: runs of non-blank lines, or one
//      document per file; JSONL: the "text" field of each line);
//   2. choose the validation documents: round(val_fraction x documents) of them, picked by a
//      partial Fisher-Yates shuffle driven by the project's PRNG seeded with --seed;
//   3. tokenize the documents in input order, joining each split's documents with eot_id
//      between them, and write train.h5 and val.h5 (as *.new files first, then manifest.json
//      naming both with their content hashes, then the renames, so a failure leaves no partial
//      file and an interrupted run no pair that llmpi-train accepts).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset_identity.h"
#include "data/content_hash.h"
#include "data/glue.h"
#include "data/token_file.h"
#include "runtime/error.h"
#include "runtime/rng.h"
#include "tokenizer/tokenizer.h"

using namespace llmpi;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 1234567 -> "1,234,567"
std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return v < 0 ? "-" + s : s;
}

std::string read_input(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail("input '", path, "' is a directory; give the files inside it (--input DIR/*.txt)");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read input '", path, "': ", std::strerror(errno), "; check the path");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read input '", path, "': read error; check the file");
  return ss.str();
}

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

// Plain text, documents separated by blank (empty or whitespace-only) lines. A document is its
// lines as they are in the file, without the line break after its last line.
void split_blank_lines(std::string_view s, std::vector<std::string_view>& docs) {
  size_t pos = 0, doc_start = std::string_view::npos, doc_end = 0;
  while (pos < s.size()) {
    size_t eol = s.find('\n', pos);
    size_t line_end = eol == std::string_view::npos ? s.size() : eol;
    std::string_view line = s.substr(pos, line_end - pos);
    if (!is_blank(line)) {
      if (doc_start == std::string_view::npos) doc_start = pos;
      doc_end = line_end - (line.back() == '\r' ? 1 : 0);
    } else if (doc_start != std::string_view::npos) {
      docs.push_back(s.substr(doc_start, doc_end - doc_start));
      doc_start = std::string_view::npos;
    }
    pos = eol == std::string_view::npos ? s.size() : eol + 1;
  }
  if (doc_start != std::string_view::npos) docs.push_back(s.substr(doc_start, doc_end - doc_start));
}

// JSONL: one {"text": "..."} object per line; blank lines are skipped.
void split_jsonl(const std::string& path, std::string_view s, std::deque<std::string>& owned,
                 std::vector<std::string_view>& docs, int64_t& empty_docs) {
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < s.size()) {
    size_t eol = s.find('\n', pos);
    size_t line_end = eol == std::string_view::npos ? s.size() : eol;
    std::string_view line = s.substr(pos, line_end - pos);
    pos = eol == std::string_view::npos ? s.size() : eol + 1;
    line_no++;
    if (is_blank(line)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(path, ":", line_no, ": not valid JSON (", e.what(),
           "); each line of a JSONL input must be one {\"text\": ...} object");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail(path, ":", line_no, ": expected an object with a string \"text\" field, like "
           "{\"text\": \"...\"}; fix the line or use --input-format text");
    std::string text = j["text"].get<std::string>();
    if (text.empty()) {
      empty_docs++;
      continue;
    }
    owned.push_back(std::move(text));
    docs.push_back(owned.back());
  }
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One progress line on stderr every couple of seconds (none for quick runs).
struct Progress {
  Clock::time_point start = Clock::now(), last = Clock::now();
  bool tty = isatty(2);
  bool printed = false;
  void update(int64_t bytes_done, int64_t bytes_total, int64_t tokens, bool force = false) {
    if (!force && std::chrono::duration<double>(Clock::now() - last).count() < 2.0) return;
    last = Clock::now();
    double s = seconds_since(start);
    std::fprintf(stderr, "%sllmpi-prep: tokenized %.1f / %.1f MB, %s tokens, %.2fM tokens/s%s",
                 tty ? "\r" : "", bytes_done / 1e6, bytes_total / 1e6, with_commas(tokens).c_str(),
                 s > 0 ? tokens / s / 1e6 : 0.0, tty ? "" : "\n");
    std::fflush(stderr);
    printed = true;
  }
  void done(int64_t bytes_total, int64_t tokens) {
    if (printed) {
      update(bytes_total, bytes_total, tokens, true);
      if (tty) std::fputc('\n', stderr);
    }
  }
};

struct PrepOptions {
  std::string tokenizer;
  std::string gpt2_encoder, gpt2_merges;
  bool lowercase = false;  // wordpiece:PATH only
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.05;
  std::string input_format = "auto";
  std::string split_docs = "blank-line";
  uint64_t seed = 1234;
  bool allow_special = false;
};

int run_prep(const PrepOptions& o) {
  if (o.tokenizer.empty())
    fail("give --tokenizer byte, gpt2, hf:PATH/tokenizer.json or wordpiece:PATH/vocab.txt (see --help)");
  if (o.inputs.empty()) fail("give at least one --input FILE (see --help)");
  if (o.out.empty()) fail("give the output directory with --out DIR (see --help)");
  if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0))
    fail("--val-fraction ", o.val_fraction, " must be between 0 and 1 (exclusive), e.g. 0.05, "
         "so that both train.h5 and val.h5 get documents");
  Tokenizer tok = load_tokenizer(o.tokenizer, o.gpt2_encoder, o.gpt2_merges, o.lowercase);

  // 1. Read the inputs and cut them into documents.
  std::vector<std::string> contents;  // file bytes (text documents point into these)
  std::deque<std::string> owned;      // JSONL document texts
  std::vector<std::string_view> docs;
  int64_t empty_docs = 0, bytes_read = 0;
  contents.reserve(o.inputs.size());
  for (const std::string& path : o.inputs) {
    contents.push_back(read_input(path));
    const std::string& s = contents.back();
    bytes_read += int64_t(s.size());
    bool jsonl = o.input_format == "jsonl" ||
                 (o.input_format == "auto" && (ends_with(path, ".jsonl") || ends_with(path, ".JSONL")));
    if (jsonl) {
      split_jsonl(path, s, owned, docs, empty_docs);
      std::string().swap(contents.back());  // the documents were copied out
    } else if (o.split_docs == "file") {
      if (s.find_first_not_of(" \t\r\n\f\v") == std::string::npos)
        empty_docs++;
      else
        docs.push_back(s);
    } else {
      split_blank_lines(s, docs);
    }
  }
  const int64_t n_docs = int64_t(docs.size());
  if (n_docs == 0)
    fail("the inputs hold no documents (", with_commas(bytes_read),
         " bytes, all blank or empty); check the --input files and --input-format");

  // 2. Choose the validation documents.
  int64_t n_val = std::llround(o.val_fraction * double(n_docs));
  if (n_val == 0 || n_val == n_docs)
    fail("--val-fraction ", o.val_fraction, " of ", n_docs, " document", n_docs == 1 ? "" : "s",
         " leaves ", n_val == 0 ? "val.h5" : "train.h5", " empty; ",
         n_docs < 2 ? "give more than one document (e.g. --split-docs blank-line, or several "
                      "--input files with --split-docs file)"
                    : "choose a fraction that gives both splits at least one document");
  std::vector<char> is_val(size_t(n_docs), 0);
  {
    std::vector<int64_t> order(static_cast<size_t>(n_docs));
    for (int64_t i = 0; i < n_docs; i++) order[size_t(i)] = i;
    Rng rng(o.seed, /*stream=*/0x707265700ull);  // "prep"
    for (int64_t i = 0; i < n_val; i++) {
      int64_t j = i + int64_t(rng.below(uint64_t(n_docs - i)));
      std::swap(order[size_t(i)], order[size_t(j)]);
      is_val[size_t(order[size_t(i)])] = 1;
    }
  }

  // 3. Tokenize, documents joined by eot_id within each split.
  std::vector<uint32_t> train, val;
  train.reserve(size_t(bytes_read / (tok.kind == TokenizerKind::byte ? 1 : 4)) + 16);
  int64_t bytes_done = 0;
  bool any_train = false, any_val = false;
  int64_t doc_bytes = 0;
  for (std::string_view d : docs) doc_bytes += int64_t(d.size());
  Progress progress;
  const auto t0 = Clock::now();
  for (int64_t d = 0; d < n_docs; d++) {
    std::vector<uint32_t>& dst = is_val[size_t(d)] ? val : train;
    bool& any = is_val[size_t(d)] ? any_val : any_train;
    if (any) dst.push_back(uint32_t(tok.eot_id));
    any = true;
    encode_append(tok, docs[size_t(d)], dst, o.allow_special);
    bytes_done += int64_t(docs[size_t(d)].size());
    if ((d & 255) == 0 || docs[size_t(d)].size() > (1 << 20))
      progress.update(bytes_done, doc_bytes, int64_t(train.size() + val.size()));
  }
  const double tok_seconds = seconds_since(t0);
  progress.done(bytes_done, int64_t(train.size() + val.size()));

  // 4. Write, atomically per file; never leave train.h5 without its val.h5.
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec || !std::filesystem::is_directory(o.out))
    fail("cannot create output directory '", o.out, "'", ec ? ": " + ec.message() : std::string(),
         "; choose a writable --out");
  const std::string train_path = (std::filesystem::path(o.out) / "train.h5").string();
  const std::string val_path = (std::filesystem::path(o.out) / "val.h5").string();
  TokenFileAttrs attrs;
  attrs.vocab_size = tok.vocab_size;
  attrs.eot_id = tok.eot_id;
  attrs.tokenizer = tok.description;
  attrs.created_by = "llmpi-prep";
  // One unit (data/dataset_identity.h): both files are first written as *.h5.new (each itself
  // via .tmp + rename), then manifest.json naming both with their content hashes, then the files
  // are renamed into place. Killed at any moment, the directory holds either a matching pair or
  // files that training refuses because they disagree with the manifest.
  const std::string train_new = train_path + ".new", val_new = val_path + ".new";
  for (const std::string& f : leftover_prep_files(o.out))
    std::fprintf(stderr, "llmpi-prep: note: '%s' was left by an interrupted llmpi-prep run; replacing it\n",
                 f.c_str());
  try {
    write_token_file(train_new, train, attrs);
    write_token_file(val_new, val, attrs);
    DatasetIdentity train_id = dataset_identity(open_token_file_info(train_new));
    DatasetIdentity val_id = dataset_identity(open_token_file_info(val_new));
    train_id.path = train_path;
    val_id.path = val_path;
    write_prep_manifest(o.out, {train_id, val_id}, "llmpi-prep");
    if (std::rename(train_new.c_str(), train_path.c_str()) != 0 ||
        std::rename(val_new.c_str(), val_path.c_str()) != 0)
      fail("cannot rename the new token files into '", o.out, "': ", std::strerror(errno),
           "; check the permissions of the output directory");
  } catch (...) {
    std::remove(train_new.c_str());
    std::remove(val_new.c_str());
    throw;
  }

  const std::string skipped =
      empty_docs ? " (" + with_commas(empty_docs) + " empty skipped)" : std::string();
  std::printf("llmpi-prep: %zu input file%s, %.2f MB, %s documents%s; tokenizer %s (vocab %d, "
              "eot %d)\n",
              o.inputs.size(), o.inputs.size() == 1 ? "" : "s", bytes_read / 1e6,
              with_commas(n_docs).c_str(), skipped.c_str(), tok.description.c_str(), tok.vocab_size,
              tok.eot_id);
  std::printf("  train: %12s documents %14s tokens -> %s\n", with_commas(n_docs - n_val).c_str(),
              with_commas(int64_t(train.size())).c_str(), train_path.c_str());
  std::printf("  val:   %12s documents %14s tokens -> %s\n", with_commas(n_val).c_str(),
              with_commas(int64_t(val.size())).c_str(), val_path.c_str());
  std::printf("  manifest: %s (names both files with their content hashes)\n",
              (std::filesystem::path(o.out) / kPrepManifestName).string().c_str());
  std::printf("  tokenized in %.2f s (%.2fM tokens/s)\n", tok_seconds,
              tok_seconds > 0 ? (train.size() + val.size()) / tok_seconds / 1e6 : 0.0);
  return 0;
}

struct InspectOptions {
  std::string file;
  int64_t show = 64;
  std::string gpt2_encoder, gpt2_merges;
  std::string tokenizer;  // hf:PATH / wordpiece:PATH, to decode such files
  bool lowercase = false;
};

// Text for the terminal: printable bytes as they are, others as escapes, newlines kept.
std::string printable(std::string_view s) {
  std::string out;
  char buf[8];
  for (unsigned char c : s) {
    if (c == '\n' || c == '\t' || c >= 0x20) {
      out.push_back(char(c));  // UTF-8 bytes pass through
    } else {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

int run_inspect(const InspectOptions& o) {
  if (o.show < 0) fail("--show ", o.show, " must be >= 0");
  TokenReader r(o.file);
  const TokenFileInfo& info = r.info();

  // Scan the whole file once: validates every id and counts the end-of-text tokens.
  int64_t eots = 0;
  std::vector<int32_t> block;
  const int64_t kBlock = 1 << 20;
  Fnv1a64 content;  // checked against the content_fnv1a64 attribute
  for (int64_t start = 0; start < r.n_tokens(); start += kBlock) {
    int64_t count = std::min(kBlock, r.n_tokens() - start);
    block.resize(size_t(count));
    r.read(start, count, block.data());
    for (int32_t id : block) {
      eots += id == info.eot_id;
      content.add_le(uint32_t(id), 4);
    }
  }
  if (!info.content_hash.empty() && content.hex() != info.content_hash)
    fail("token file '", info.path, "' is damaged: its tokens hash to fnv1a64 ", content.hex(),
         " but its content_fnv1a64 attribute says ", info.content_hash, "; remake it with llmpi-prep");

  std::printf("file:        %s\n", info.path.c_str());
  std::printf("format:      %s, version %d\n", kTokenFileFormat, info.version);
  std::printf("tokenizer:   %s\n", info.tokenizer.c_str());
  std::printf("vocab_size:  %s\n", with_commas(info.vocab_size).c_str());
  std::printf("eot_id:      %s\n", with_commas(info.eot_id).c_str());
  std::printf("created_by:  %s\n", info.created_by.empty() ? "(not recorded)" : info.created_by.c_str());
  std::printf("content:     %s\n", info.content_hash.empty()
                                       ? "no content hash (an older file)"
                                       : ("fnv1a64 " + info.content_hash + " (verified)").c_str());
  if (info.chunk > 0)
    std::printf("dtype:       %s, chunks of %s tokens\n", info.dtype.c_str(), with_commas(info.chunk).c_str());
  else
    std::printf("dtype:       %s, contiguous\n", info.dtype.c_str());
  std::printf("tokens:      %s (%s of them end-of-text)\n", with_commas(r.n_tokens()).c_str(),
              with_commas(eots).c_str());

  const int64_t n = std::min(o.show, r.n_tokens());
  if (n == 0) return 0;
  std::vector<int32_t> ids = r.read(0, n);
  std::printf("first %s tokens:\n ", with_commas(n).c_str());
  for (int64_t i = 0; i < n; i++) std::printf(" %d", ids[size_t(i)]);
  std::printf("\n");

  // Decode when we have the tokenizer: byte always, gpt2 when its files are given.
  const std::string kind = info.tokenizer.substr(0, info.tokenizer.find(':'));
  Tokenizer tok;
  bool have = false;
  if (kind == "byte") {
    tok = byte_tokenizer();
    have = true;
  } else if ((kind == "hf" || kind == "wordpiece") && !o.tokenizer.empty()) {
    tok = load_tokenizer(o.tokenizer, "", "", o.lowercase);
    have = true;
    if (tok.description != info.tokenizer)
      std::fprintf(stderr, "llmpi-prep: note: the file was made with tokenizer '%s' but --tokenizer "
                   "gives '%s'; the decoded text may be wrong\n",
                   info.tokenizer.c_str(), tok.description.c_str());
  } else if (kind == "gpt2" && !o.gpt2_encoder.empty() && !o.gpt2_merges.empty()) {
    tok = load_gpt2_tokenizer(o.gpt2_encoder, o.gpt2_merges);
    have = true;
    if (tok.description != info.tokenizer)
      std::fprintf(stderr, "llmpi-prep: note: the file was made with tokenizer '%s' but the given "
                   "GPT-2 files are '%s'; the decoded text may be wrong\n",
                   info.tokenizer.c_str(), tok.description.c_str());
  }
  if (have && tok.vocab_size < info.vocab_size) have = false;
  if (have) {
    std::printf("decoded:\n%s\n", printable(decode(tok, ids)).c_str());
  } else if (kind == "gpt2") {
    std::printf("(give --gpt2-encoder and --gpt2-merges to see these tokens as text)\n");
  } else if (kind == "hf" || kind == "wordpiece") {
    std::printf("(give --tokenizer %s:PATH to see these tokens as text)\n", kind.c_str());
  }
  return 0;
}

const char* kFooter = R"(
Documents and the train/val split:
  text   (--input-format text, or auto for any file not ending in .jsonl)
         --split-docs blank-line (default): documents are separated by one or more blank
         (empty or whitespace-only) lines; --split-docs file: each input file is one document.
  jsonl  (--input-format jsonl, or auto for *.jsonl): one {"text": "..."} object per line.
  Within each output file documents are joined with the tokenizer's end-of-text id between
  them. val.h5 gets round(val-fraction x documents) whole documents chosen by a seeded shuffle
  (--seed); the same inputs, options and seed always give the same split, and both files
  keep the documents in input order. Empty documents are skipped.
  A literal "<|endoftext|>" in the text is ordinary text unless --allow-special is given.

Tokenizers:
  byte   ids 0..255 = bytes, 256 = end-of-text (vocab 257); needs no files
  gpt2   GPT-2 BPE (vocab 50257, end-of-text 50256) from OpenAI's encoder.json and vocab.bpe
  hf:PATH/tokenizer.json   a Hugging Face tokenizer: byte-level BPE (GPT-2), BPE with byte
         fallback and the metaspace (LLaMA), or WordPiece (BERT), with its normalizer, added and
         special tokens (--allow-special: matched in the text); end-of-text = the first of
         <|endoftext|>, </s>, <|end_of_text|>, <eos>, [SEP] it has
  wordpiece:PATH/vocab.txt [--lowercase]   BERT's plain vocabulary (uncased models need
         --lowercase, which also strips accents); end-of-text = [SEP]

Outputs: DIR/train.h5 and DIR/val.h5 (HDF5, dataset 'tokens'; see DESIGN.md) and
DIR/manifest.json, written as one unit: both files as *.new first, then the manifest naming
them with their content hashes, then the renames. A run killed at any point leaves no partial
file, and llmpi-train refuses a train/val pair that disagrees with the manifest (rerun
llmpi-prep; it reports and replaces leftover *.new files). Progress goes to stderr, the
summary to stdout; exit code 0 on success, 1 on error.

GLUE tasks to classification files (model.family bert):
  llmpi-prep glue --task rte|mrpc|sst-2|qnli|cola --data-dir GLUE/RTE
                  --tokenizer hf:PATH/tokenizer.json|wordpiece:PATH/vocab.txt [--lowercase]
                  [--max-seq-len 128] --out DIR
  reads train.tsv and dev.tsv of --data-dir (split on tabs only), writes [CLS] s1 [SEP] s2 [SEP]
  with token types, truncated longest-first and padded with [PAD] to --max-seq-len, as
  OUT/train.h5, OUT/dev.h5 and OUT/manifest.json (one unit, as above).

Inspect a token file:
  llmpi-prep inspect DIR/train.h5 [--show 64] [--gpt2-encoder P --gpt2-merges P]
                    [--tokenizer hf:PATH|wordpiece:PATH [--lowercase]]

Examples:
  llmpi-prep --tokenizer byte --input input.txt --out data/shakespeare-char
  llmpi-prep --tokenizer gpt2 --gpt2-encoder gpt2/encoder.json --gpt2-merges gpt2/vocab.bpe \
             --input stories.jsonl --out data/stories --val-fraction 0.01
)";

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llmpi-prep: tokenize text or JSONL into HDF5 token files (DIR/train.h5, DIR/val.h5) "
               "for llmpi-train, GLUE tasks into classification files (glue), or inspect a token file.",
               "llmpi-prep"};
  app.footer(kFooter);
  app.require_subcommand(0, 1);

  PrepOptions p;
  app.add_option("--tokenizer", p.tokenizer, "byte | gpt2 | hf:PATH/tokenizer.json | wordpiece:PATH/vocab.txt")
      ->type_name("KIND")
      ->check([](const std::string& v) {
        return v == "byte" || v == "gpt2" || v.rfind("hf:", 0) == 0 || v.rfind("wordpiece:", 0) == 0
                   ? std::string()
                   : "unknown tokenizer '" + v + "'; use byte, gpt2, hf:PATH/tokenizer.json or wordpiece:PATH/vocab.txt";
      });
  app.add_flag("--lowercase", p.lowercase,
               "lower-case and strip accents (--tokenizer wordpiece: of an uncased BERT vocab.txt)");
  app.add_option("--gpt2-encoder", p.gpt2_encoder, "path to GPT-2 encoder.json (--tokenizer gpt2)")
      ->type_name("PATH");
  app.add_option("--gpt2-merges", p.gpt2_merges, "path to GPT-2 vocab.bpe (--tokenizer gpt2)")
      ->type_name("PATH");
  app.add_option("--input", p.inputs, "input file (repeat the option, or give several)")
      ->type_name("FILE");
  app.add_option("--out", p.out, "output directory (created if missing)")->type_name("DIR");
  app.add_option("--val-fraction", p.val_fraction,
                 "fraction of documents for val.h5, in (0, 1)")
      ->capture_default_str();
  app.add_option("--input-format", p.input_format, "auto | text | jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  app.add_option("--split-docs", p.split_docs, "how plain text splits into documents: blank-line | file")
      ->check(CLI::IsMember({"blank-line", "file"}))
      ->capture_default_str();
  app.add_option("--seed", p.seed, "seed of the train/val document choice")->capture_default_str();
  app.add_flag("--allow-special", p.allow_special,
               "encode a literal <|endoftext|> in the text as the end-of-text token");

  InspectOptions in;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "print a token file's attributes, dtype, token count and first tokens");
  inspect->add_option("file", in.file, "token file (.h5)")->required();
  inspect->add_option("--show", in.show, "how many leading tokens to print")->capture_default_str();
  inspect->add_option("--gpt2-encoder", in.gpt2_encoder, "GPT-2 encoder.json, to decode gpt2 tokens");
  inspect->add_option("--gpt2-merges", in.gpt2_merges, "GPT-2 vocab.bpe, to decode gpt2 tokens");
  inspect->add_option("--tokenizer", in.tokenizer, "hf:PATH or wordpiece:PATH, to decode such tokens")
      ->type_name("KIND");
  inspect->add_flag("--lowercase", in.lowercase, "with --tokenizer wordpiece:PATH of an uncased vocab");

  GluePrepOptions g;
  CLI::App* glue = app.add_subcommand(
      "glue", "GLUE task TSVs (train.tsv, dev.tsv) to classification files for model.family bert");
  glue->add_option("--task", g.task, "rte | mrpc | sst-2 | qnli | cola")->required();
  glue->add_option("--data-dir", g.data_dir, "the task's GLUE folder (train.tsv, dev.tsv)")
      ->type_name("DIR")->required();
  glue->add_option("--tokenizer", g.tokenizer, "hf:PATH/tokenizer.json | wordpiece:PATH/vocab.txt")
      ->type_name("KIND")->required();
  glue->add_flag("--lowercase", g.lowercase, "with --tokenizer wordpiece:PATH of an uncased vocab");
  glue->add_option("--max-seq-len", g.max_seq_len, "tokens per example, after truncation and padding")
      ->capture_default_str();
  glue->add_option("--out", g.out, "output directory (train.h5, dev.h5, manifest.json)")
      ->type_name("DIR")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "llmpi-prep: error: %s; see llmpi-prep --help\n", one_line(e.what()).c_str());
    return 1;
  }
  try {
    if (inspect->parsed()) return run_inspect(in);
    if (glue->parsed()) {
      run_glue_prep(g);
      return 0;
    }
    return run_prep(p);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "llmpi-prep: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
