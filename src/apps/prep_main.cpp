// llmpi-prep: turn text / JSONL into an llmpi-prep data set (DIR/manifest.json and token files, one
// per split or numbered shards), on one process or many (mpiexec -n N), and inspect token files and
// data sets.
//
//   [mpiexec -n N] llmpi-prep --tokenizer byte|gpt2|hf:PATH|wordpiece:PATH
//              [--gpt2-encoder P --gpt2-merges P] [--lowercase] --input FILE|PATTERN|- ...
//              --out DIR [--val-fraction 0.05] [--input-format auto|text|jsonl]
//              [--split-docs blank-line|file] [--seed N] [--allow-special]
//              [--shard-tokens 1G] [--split-bytes 64M] [--overwrite]
//   llmpi-prep inspect FILE|DIR|DIR/SPLIT [--show N] [--gpt2-encoder P --gpt2-merges P]
//   llmpi-prep glue --task rte --data-dir DIR --tokenizer hf:PATH|wordpiece:PATH [--lowercase]
//              [--max-seq-len 128] --out DIR [--overwrite]   (data/glue.h)
//
// How the data set is made, and why its output is the same on any number of ranks:
// data/token_prep.h. Its layout and the atomic switch between data sets: data/prep_manifest.h.
// Every rank parses the command line; errors are printed once (by rank 0) and every rank exits 1.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/classification_file.h"
#include "data/content_hash.h"
#include "data/glue.h"
#include "data/prep_manifest.h"
#include "data/path_util.h"
#include "data/token_file.h"
#include "data/token_prep.h"
#include "runtime/error.h"
#include "runtime/mpi_env.h"
#include "tokenizer/tokenizer.h"

using namespace llmpi;

namespace {

// 1234567 -> "1,234,567"
std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return v < 0 ? "-" + s : s;
}

// "100M" -> 100 * unit^2: digits with an optional K, M, G or T (unit 1000 for counts, 1024 for
// bytes); an Error naming the flag and the accepted range otherwise.
int64_t parse_amount(const std::string& flag, const std::string& text, int64_t unit, int64_t lo, int64_t hi,
                     const std::string& range_text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') digits++;
  int64_t scale = 1;
  const std::string suffix = text.substr(digits);
  const std::string letters = "KMGT";
  if (suffix.size() == 1 && letters.find(char(std::toupper(suffix[0]))) != std::string::npos)
    for (size_t k = 0; k <= letters.find(char(std::toupper(suffix[0]))); k++) scale *= unit;
  else if (!suffix.empty())
    digits = 0;
  long double v = 0;
  if (digits > 0 && digits <= 19) v = std::stold(text.substr(0, digits)) * scale;
  if (digits == 0 || digits > 19 || v < lo || v > hi)
    fail(flag, " '", text, "' is outside ", range_text, "; give a whole number, optionally with K, M, G or T");
  return int64_t(v);
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// ---- inspect -----------------------------------------------------------------------------------

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

// Read every token of r once: validates every id, checks every file's content hash, counts the
// end-of-text tokens. Returns the end-of-text count and the stream's hash.
std::pair<int64_t, std::string> verify_all(TokenReader& r, bool list_shards) {
  int64_t eots = 0;
  std::vector<int32_t> block;
  const int64_t kBlock = 1 << 20;
  Fnv1a64 stream;
  for (const TokenReader::Shard& s : r.shards()) {
    Fnv1a64 content;
    for (int64_t at = 0; at < s.n_tokens; at += kBlock) {
      const int64_t count = std::min(kBlock, s.n_tokens - at);
      block.resize(size_t(count));
      r.read(s.offset + at, count, block.data());
      for (int32_t id : block) {
        eots += id == r.info().eot_id;
        content.add_le(uint32_t(id), 4);
        stream.add_le(uint32_t(id), 4);
      }
    }
    if (!s.content_hash.empty() && content.hex() != s.content_hash)
      fail("token file '", s.path, "' is damaged: its tokens hash to fnv1a64 ", content.hex(),
           " but its content_fnv1a64 attribute says ", s.content_hash, "; remake it with llmpi-prep");
    if (list_shards)
      std::printf("  %-28s %15s tokens  fnv1a64 %s (verified)\n", base_of(s.path).c_str(),
                  with_commas(s.n_tokens).c_str(), s.content_hash.c_str());
  }
  return {eots, stream.hex()};
}

// Print one file or split; decode its first tokens when `show` > 0 and the tokenizer is at hand.
void inspect_one(const std::string& path, const InspectOptions& o, int64_t show) {
  TokenReader r(path);
  const TokenFileInfo& info = r.info();
  if (info.split.empty()) {
    std::printf("file:        %s\n", info.path.c_str());
  } else {
    std::printf("split:       %s of %s (%s)\n", info.split.c_str(), dir_of(info.manifest).c_str(),
                info.manifest.c_str());
    std::printf("shards:      %s\n", with_commas(info.n_shards).c_str());
  }
  const auto [eots, stream_hash] = verify_all(r, !info.split.empty());
  std::printf("format:      %s, version %d\n", kTokenFileFormat, info.version);
  std::printf("tokenizer:   %s\n", info.tokenizer.c_str());
  std::printf("vocab_size:  %s\n", with_commas(info.vocab_size).c_str());
  std::printf("eot_id:      %s\n", with_commas(info.eot_id).c_str());
  std::printf("created_by:  %s\n", info.created_by.empty() ? "(not recorded)" : info.created_by.c_str());
  if (info.content_hash.empty())
    std::printf("content:     no content hash (an older file)\n");
  else if (info.n_shards > 1)
    std::printf("content:     fnv1a64 %s (of the shard list; every shard verified); the stream's tokens hash to "
                "fnv1a64 %s\n", info.content_hash.c_str(), stream_hash.c_str());
  else
    std::printf("content:     fnv1a64 %s (verified)\n", info.content_hash.c_str());
  if (info.chunk > 0)
    std::printf("dtype:       %s, chunks of %s tokens\n", info.dtype.c_str(), with_commas(info.chunk).c_str());
  else
    std::printf("dtype:       %s, contiguous\n", info.dtype.c_str());
  std::printf("tokens:      %s (%s of them end-of-text)\n", with_commas(r.n_tokens()).c_str(),
              with_commas(eots).c_str());

  const int64_t n = std::min(show, r.n_tokens());
  if (n == 0) return;
  std::vector<int32_t> ids = r.read(0, n);
  std::printf("first %s tokens:\n ", with_commas(n).c_str());
  for (int64_t i = 0; i < n; i++) std::printf(" %d", ids[size_t(i)]);
  std::printf("\n");

  // Decode when we have the tokenizer: byte always, gpt2 / hf / wordpiece when their files are given.
  const std::string kind = info.tokenizer.substr(0, info.tokenizer.find(':'));
  Tokenizer tok;
  bool have = false;
  if (kind == "byte") {
    tok = byte_tokenizer();
    have = true;
  } else if ((kind == "hf" || kind == "wordpiece") && !o.tokenizer.empty()) {
    tok = load_tokenizer(o.tokenizer, "", "", o.lowercase);
    have = true;
  } else if (kind == "gpt2" && !o.gpt2_encoder.empty() && !o.gpt2_merges.empty()) {
    tok = load_gpt2_tokenizer(o.gpt2_encoder, o.gpt2_merges);
    have = true;
  }
  if (have && tok.description != info.tokenizer && kind != "byte")
    std::fprintf(stderr, "llmpi-prep: note: the data was made with tokenizer '%s' but the given files are "
                 "'%s'; the decoded text may be wrong\n", info.tokenizer.c_str(), tok.description.c_str());
  if (have && tok.vocab_size < info.vocab_size) have = false;
  if (have) {
    std::printf("decoded:\n%s\n", printable(decode(tok, ids)).c_str());
  } else if (kind == "gpt2") {
    std::printf("(give --gpt2-encoder and --gpt2-merges to see these tokens as text)\n");
  } else if (kind == "hf" || kind == "wordpiece") {
    std::printf("(give --tokenizer %s:PATH to see these tokens as text)\n", kind.c_str());
  }
}

int run_inspect(const InspectOptions& o) {
  if (o.show < 0 || o.show > 1000000)
    fail("--show ", o.show, " is outside 0..1,000,000 (how many leading tokens to print)");
  std::string dir = o.file;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::optional<PrepManifest> m;
  if (std::filesystem::is_directory(dir)) m = read_prep_manifest(dir);
  if (!m || m->version == 1) {  // one file or split (a directory without a manifest is refused there)
    if (hdf5_format_of(o.file) == kClassificationFileFormat)
      fail("'", o.file, "' is a classification file or split (llmpi-prep glue's); llmpi-prep inspect reads "
           "token data, and `llmpi-prep inspect ", dir_of(o.file), "` lists a glue data set's splits");
    inspect_one(o.file, o, o.show);
    return 0;
  }
  // A whole data set: every split, every shard verified.
  int64_t files = 0, tokens = 0, examples = 0;
  std::printf("data set:    %s (%s, generation %lld, made by %s)\n", dir.c_str(),
              join_path(dir, kPrepManifestName).c_str(), (long long)m->generation, m->created_by.c_str());
  bool first = true;
  for (const auto& [name, split] : m->splits) {
    std::printf("\n");
    if (split.kind == kClassificationSplitKind) {  // opened (and checked against the manifest) whole
      const ClassificationInfo ci = open_classification_file_info(join_path(dir, name));
      std::printf("split:       %s of %s: classification, %s examples of %d tokens, %zu labels\n"
                  "file:        %s, content fnv1a64 %s (its attribute, as the manifest says)\n",
                  name.c_str(), dir.c_str(), with_commas(ci.n_examples).c_str(), ci.seq_len,
                  ci.label_names.size(), ci.path.c_str(), ci.content_hash.c_str());
      files++;
      examples += ci.n_examples;
      continue;
    }
    inspect_one(join_path(dir, name), o, first ? o.show : 0);
    first = false;
    files += int64_t(split.shards.size());
    tokens += split.size;
  }
  std::string held = tokens ? with_commas(tokens) + " tokens" : "";
  if (examples) held += (held.empty() ? "" : ", ") + with_commas(examples) + " examples";
  std::printf("\nall %s files of %s splits %s: %s\n", with_commas(files).c_str(),
              with_commas(int64_t(m->splits.size())).c_str(),
              examples ? "checked against the manifest" : "verified", held.c_str());
  return 0;
}

const char* kFooter = R"(
Documents and the train/val split:
  text   (--input-format text, or auto for any input not named *.jsonl)
         --split-docs blank-line (default): documents are separated by one or more blank
         (empty or whitespace-only) lines; --split-docs file: each input is one document.
  jsonl  (--input-format jsonl, or auto for *.jsonl): one {"text": "..."} object per line.
  Inputs may be gzip or zstd compressed (told by their first bytes; *.jsonl.gz and *.jsonl.zst
  are jsonl), quoted glob patterns ('corpus/*.jsonl.zst', expanded and sorted by llmpi-prep), or
  - for standard input (text unless --input-format jsonl), so another format can be piped in.
  Within each split documents are joined with the tokenizer's end-of-text id between them.
  The val split gets round(val-fraction x documents) whole documents chosen by seeded selection
  sampling over the documents in input order (--seed); the same inputs, options and seed give
  the same data set on any number of ranks. Empty documents are skipped. A literal
  "<|endoftext|>" in the text is ordinary text unless --allow-special is given.

Many ranks (mpiexec -n N llmpi-prep ...): the inputs are divided into units (files, and byte
  ranges of --split-bytes of large uncompressed files, cut at document boundaries), shared out
  among the ranks and tokenized side by side; every rank must see the inputs and --out. Memory
  per rank stays bounded (a read buffer, the longest document, copy buffers), whatever the input
  size; the work files in DIR/.llmpi-prep-work take about as much disk as the output.

Outputs (a data set; docs/DESIGN.md): DIR/manifest.json and, per split, DIR/train.h5 and
  DIR/val.h5 when a split holds at most --shard-tokens tokens (default 1G), else numbered shards
  DIR/train-00000.h5 ... of exactly --shard-tokens tokens (the last shorter), read by llmpi-train
  as one stream: data.train = DIR (its train split) or DIR/train, data.val = DIR/val (or
  DIR/train.h5 and DIR/val.h5, as always). The manifest lists every file with its token count and
  content hash and is written last. Re-making DIR writes new files beside the old ones, switches by
  renaming the manifest and then deletes the old files, so DIR always holds one complete data set.
  llmpi-prep writes into a new or empty directory or over an llmpi-prep data set; another
  non-empty directory needs --overwrite. One llmpi-prep at a time per DIR: a run holds
  DIR/.llmpi-prep.lock, and a second one is refused at once, naming the first (host, pid).
  Progress goes to stderr, the summary to stdout; exit code 0 on success, 1 on error (on every
  rank).

GLUE tasks to classification files (model.family bert):
  llmpi-prep glue --task rte|mrpc|sst-2|qnli|cola --data-dir GLUE/RTE
                  --tokenizer hf:PATH/tokenizer.json|wordpiece:PATH/vocab.txt [--lowercase]
                  [--max-seq-len 128] --out DIR [--overwrite]
  reads train.tsv and dev.tsv of --data-dir (split on tabs only), writes [CLS] s1 [SEP] s2 [SEP]
  with token types, truncated longest-first and padded with [PAD] to --max-seq-len, as a data
  set of two classification splits: OUT/manifest.json naming OUT/train.h5 and OUT/dev.h5 (remade,
  the new pair is written beside the old one and switched in by the manifest, so OUT always holds
  one complete pair; name the splits OUT/train.h5 and OUT/dev.h5 (or OUT/dev) in data.train and
  data.val whatever their files are called).

Inspect a token file, a split or a whole data set (every token read, every hash verified):
  llmpi-prep inspect DIR | DIR/train | DIR/train.h5 [--show 64] [--gpt2-encoder P --gpt2-merges P]
                    [--tokenizer hf:PATH|wordpiece:PATH [--lowercase]]

Examples:
  llmpi-prep --tokenizer byte --input input.txt --out data/shakespeare-char
  mpiexec -n 64 llmpi-prep --tokenizer gpt2 --gpt2-encoder gpt2/encoder.json \
             --gpt2-merges gpt2/vocab.bpe --input 'fineweb/*.jsonl.zst' --out data/fineweb \
             --shard-tokens 100M --val-fraction 0.001
)";

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  set_program_name("llmpi-prep");
  const bool root = env.rank == 0;
  CLI::App app{"llmpi-prep: tokenize text or JSONL into an llmpi-prep data set (DIR/manifest.json, DIR/train.h5, "
               "DIR/val.h5 or their shards) for llmpi-train, on one or many ranks; GLUE tasks into "
               "classification files (glue); or inspect token files and data sets.",
               "llmpi-prep"};
  app.footer(kFooter);
  app.require_subcommand(0, 1);

  TokenPrepOptions p;
  std::string seed_text = std::to_string(p.seed), shard_text = "1G", split_text = "64M";
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
  app.add_option("--input", p.inputs, "input file, quoted glob pattern, or - for standard input (repeatable)")
      ->type_name("FILE");
  app.add_option("--out", p.out, "output directory (created if missing)")->type_name("DIR");
  app.add_option("--val-fraction", p.val_fraction, "fraction of documents for the val split, in (0, 1)")
      ->capture_default_str();
  app.add_option("--input-format", p.input_format, "auto | text | jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  app.add_option("--split-docs", p.split_docs, "how plain text splits into documents: blank-line | file")
      ->check(CLI::IsMember({"blank-line", "file"}))
      ->capture_default_str();
  app.add_option("--seed", seed_text, "seed of the train/val document choice, 0..2^64-1")->capture_default_str();
  app.add_flag("--allow-special", p.allow_special,
               "encode a literal <|endoftext|> in the text as the end-of-text token");
  app.add_option("--shard-tokens", shard_text,
                 "tokens per shard, 1..1T (K, M, G, T = 10^3, 10^6, 10^9, 10^12); a split of at most this "
                 "many tokens is one file")
      ->capture_default_str();
  app.add_option("--split-bytes", split_text,
                 "divide uncompressed inputs larger than this into ranges of this size for the ranks, "
                 "4K..1T (K, M, G, T = 2^10, 2^20, 2^30, 2^40); does not change the output")
      ->capture_default_str();
  app.add_flag("--overwrite", p.overwrite, "write into a non-empty --out that holds no llmpi-prep data set");

  InspectOptions in;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "print a token file's, split's or data set's attributes, sizes and first tokens, "
                 "verifying every token and content hash");
  inspect->add_option("file", in.file, "token file (.h5), data set directory, or DIR/SPLIT")->required();
  inspect->add_option("--show", in.show, "how many leading tokens to print, 0..1,000,000")->capture_default_str();
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
  glue->add_option("--max-seq-len", g.max_seq_len, "tokens per example after truncation and padding, 1..65536")
      ->capture_default_str();
  glue->add_option("--out", g.out, "output directory (train.h5, dev.h5, manifest.json)")
      ->type_name("DIR")->required();
  glue->add_flag("--overwrite", g.overwrite, "write into a non-empty --out that holds no llmpi-prep data set");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return root ? app.exit(e) : 0;  // --help
    if (root) std::fprintf(stderr, "llmpi-prep: error: %s; see llmpi-prep --help\n", one_line(e.what()).c_str());
    return 1;
  }
  try {
    if (inspect->parsed() || glue->parsed()) {
      if (env.world > 1)
        fail("llmpi-prep ", inspect->parsed() ? "inspect" : "glue", " runs on one process; run it without mpiexec");
      if (inspect->parsed()) return run_inspect(in);
      run_glue_prep(g);
      return 0;
    }
    if (p.tokenizer.empty())
      fail("give --tokenizer byte, gpt2, hf:PATH/tokenizer.json or wordpiece:PATH/vocab.txt (see --help)");
    if (p.inputs.empty()) fail("give at least one --input FILE (see --help)");
    if (p.out.empty()) fail("give the output directory with --out DIR (see --help)");
    if (!(p.val_fraction > 0.0 && p.val_fraction < 1.0))
      fail("--val-fraction ", p.val_fraction, " is outside (0, 1): give a fraction between 0 and 1 (exclusive), "
           "e.g. 0.05, so that both splits get documents");
    {
      errno = 0;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(seed_text.c_str(), &end, 10);
      if (seed_text.empty() || seed_text[0] < '0' || seed_text[0] > '9' || errno != 0 || *end != '\0')
        fail("--seed '", seed_text, "' is outside 0..18446744073709551615; give a whole number");
      p.seed = uint64_t(v);
    }
    p.shard_tokens = parse_amount("--shard-tokens", shard_text, 1000, 1, int64_t(1000000000000),
                                  "1..1,000,000,000,000 tokens");
    p.split_bytes = parse_amount("--split-bytes", split_text, 1024, 4096, int64_t(1) << 40, "4K..1T bytes");
    run_token_prep(p, MPI_COMM_WORLD);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (root) std::fprintf(stderr, "llmpi-prep: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
