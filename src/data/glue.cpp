// GLUE TSVs to classification files. Contract: glue.h.
#include "data/glue.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/dataset_identity.h"
#include "data/prep_manifest.h"
#include "runtime/error.h"

namespace llmpi {

// The layouts of the GLUE download (download_glue_data.py). Label order = the ids transformers'
// GLUE processors and the `datasets` hub copies use.
const std::vector<GlueTask>& glue_tasks() {
  static const std::vector<GlueTask> tasks = {
      {"rte", "train.tsv", "dev.tsv", {"index", "sentence1", "sentence2", "label"}, 4, 1, 2, 3,
       {{"entailment", "entailment"}, {"not_entailment", "not_entailment"}}},
      {"mrpc", "train.tsv", "dev.tsv", {"Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"}, 5,
       3, 4, 0, {{"0", "not_equivalent"}, {"1", "equivalent"}}},
      {"sst-2", "train.tsv", "dev.tsv", {"sentence", "label"}, 2, 0, -1, 1,
       {{"0", "negative"}, {"1", "positive"}}},
      {"qnli", "train.tsv", "dev.tsv", {"index", "question", "sentence", "label"}, 4, 1, 2, 3,
       {{"entailment", "entailment"}, {"not_entailment", "not_entailment"}}},
      {"cola", "train.tsv", "dev.tsv", {}, 4, 3, -1, 1,
       {{"0", "unacceptable"}, {"1", "acceptable"}}},
  };
  return tasks;
}

const GlueTask& find_glue_task(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::string known;
  for (const GlueTask& t : glue_tasks()) {
    if (t.name == lower) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  fail("unknown GLUE task '", name, "'; known tasks: ", known);
}

// Remove one id at a time from the end of the longer sequence (the second on a tie) until
// |a| + |b| <= max_total: the shorter one keeps its length while it fits in half, otherwise
// a gets ceil(max_total / 2) and b floor(max_total / 2).
void truncate_longest_first(std::vector<uint32_t>& a, std::vector<uint32_t>& b, size_t max_total) {
  while (a.size() + b.size() > max_total) {
    if (a.size() > b.size())
      a.pop_back();
    else
      b.pop_back();
  }
}

int64_t glue_pad_id(const Tokenizer& tok) {
  if (tok.kind == TokenizerKind::hf) {
    std::vector<uint32_t> ids = encode(tok, "[PAD]", /*allow_special=*/true);
    if (ids.size() == 1) return ids[0];
  }
  fail("tokenizer ", tok.description, " has no [PAD] token; llmpi-prep glue needs a BERT-style "
       "tokenizer (hf:PATH/tokenizer.json or wordpiece:PATH/vocab.txt)");
}

namespace {

std::string join_columns(const std::vector<std::string>& cols) {
  std::string s;
  for (const std::string& c : cols) s += (s.empty() ? "" : "<TAB>") + c;
  return s;
}

std::vector<std::string_view> split_tabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  for (;;) {
    size_t tab = line.find('\t', pos);
    if (tab == std::string_view::npos) {
      out.push_back(line.substr(pos));
      return out;
    }
    out.push_back(line.substr(pos, tab - pos));
    pos = tab + 1;
  }
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read '", path, "': ", std::strerror(errno), "; --data-dir must be the task's "
               "GLUE folder (with train.tsv and dev.tsv)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

ClassificationExamples glue_examples(const GlueTask& task, const std::string& path,
                                     std::string_view content, const Tokenizer& tok,
                                     int max_seq_len, int64_t pad_id) {
  const bool pair = task.sentence2 >= 0;
  const std::vector<uint32_t> none;
  const size_t n_special = apply_template(tok, none, pair ? &none : nullptr).ids.size();
  if (max_seq_len < int(n_special) + (pair ? 2 : 1))
    fail("--max-seq-len ", max_seq_len, " leaves no room for the sentences (the template adds ",
         n_special, " tokens); use at least ", n_special + (pair ? 2 : 1));
  const size_t budget = size_t(max_seq_len) - n_special;
  const size_t L = size_t(max_seq_len);
  if (content.size() >= 3 && content.substr(0, 3) == "\xEF\xBB\xBF") content.remove_prefix(3);

  std::string label_list;
  for (const GlueLabel& l : task.labels) label_list += (label_list.empty() ? "" : ", ") + l.in_file;

  ClassificationExamples ex;
  ex.seq_len = max_seq_len;
  size_t pos = 0;
  int64_t line_no = 0;
  std::vector<uint32_t> a, b;
  while (pos < content.size()) {
    size_t eol = content.find('\n', pos);
    size_t end = eol == std::string_view::npos ? content.size() : eol;
    std::string_view line = content.substr(pos, end - pos);
    pos = eol == std::string_view::npos ? content.size() : eol + 1;
    line_no++;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<std::string_view> cols = split_tabs(line);
    if (line_no == 1 && !task.header.empty()) {
      std::vector<std::string> got(cols.begin(), cols.end());
      if (got != task.header)
        fail(path, ":1: not a GLUE ", task.name, " TSV: the header is '", join_columns(got),
             "', expected '", join_columns(task.header), "'; give --data-dir the task's folder "
             "from the GLUE download (or the matching --task)");
      continue;
    }
    if (line.empty() && pos >= content.size()) break;  // a final empty line
    if (int(cols.size()) != task.n_columns)
      fail(path, ":", line_no, ": ", cols.size(), " tab-separated column",
           cols.size() == 1 ? "" : "s", ", but a GLUE ", task.name, " line has ", task.n_columns,
           int(cols.size()) < task.n_columns ? " (a missing column)" : " (a tab inside a field?)",
           "; fix the line or check --task");
    std::string_view label = cols[size_t(task.label)];
    int label_id = -1;
    for (size_t k = 0; k < task.labels.size(); k++)
      if (task.labels[k].in_file == label) label_id = int(k);
    if (label_id < 0)
      fail(path, ":", line_no, ": unknown label '", label, "'; GLUE ", task.name, "'s labels are ",
           label_list, " (test.tsv has no labels: use train.tsv and dev.tsv)");

    a.clear();
    b.clear();
    encode_append(tok, cols[size_t(task.sentence1)], a, /*allow_special=*/true);
    if (pair) encode_append(tok, cols[size_t(task.sentence2)], b, /*allow_special=*/true);
    truncate_longest_first(a, b, budget);
    TemplateEncoding e = apply_template(tok, a, pair ? &b : nullptr);

    // Row: the template's ids, then pad_id (mask 0, type 0) up to L.
    const size_t n = e.ids.size();
    for (size_t i = 0; i < L; i++) {
      ex.input_ids.push_back(i < n ? int32_t(e.ids[i]) : int32_t(pad_id));
      ex.token_type_ids.push_back(i < n ? int32_t(e.type_ids[i]) : 0);
      ex.attention_mask.push_back(i < n ? 1 : 0);
    }
    ex.labels.push_back(label_id);
  }
  if (ex.labels.empty())
    fail(path, ": no examples; a GLUE ", task.name, " file has one example a line");
  return ex;
}

void run_glue_prep(const GluePrepOptions& o) {
  const GlueTask& task = find_glue_task(o.task);
  if (o.data_dir.empty()) fail("llmpi-prep glue needs --data-dir DIR (the task's GLUE folder)");
  if (o.out.empty()) fail("llmpi-prep glue needs --out DIR");
  if (o.tokenizer.rfind("hf:", 0) != 0 && o.tokenizer.rfind("wordpiece:", 0) != 0)
    fail("llmpi-prep glue needs --tokenizer hf:PATH/tokenizer.json or wordpiece:PATH/vocab.txt "
         "(a BERT tokenizer with [CLS], [SEP] and [PAD]), not '", o.tokenizer, "'");
  if (o.max_seq_len < 1 || o.max_seq_len > 65536)
    fail("--max-seq-len ", o.max_seq_len, " is outside 1..65536 (tokens per example)");
  Tokenizer tok = load_tokenizer(o.tokenizer, "", "", o.lowercase);
  const int64_t pad_id = glue_pad_id(tok);

  namespace fs = std::filesystem;
  const std::string train_in = (fs::path(o.data_dir) / task.train_file).string();
  const std::string dev_in = (fs::path(o.data_dir) / task.dev_file).string();
  // Everything is read and checked before anything is written.
  ClassificationExamples train =
      glue_examples(task, train_in, read_file_bytes(train_in), tok, o.max_seq_len, pad_id);
  ClassificationExamples dev =
      glue_examples(task, dev_in, read_file_bytes(dev_in), tok, o.max_seq_len, pad_id);

  // Refuses another program's files; the current data set, if any, stays until the switch.
  const PrepDestination dest = open_prep_destination(o.out, o.overwrite, {train_in, dev_in});  // (and its lock)
  for (const std::string& n : dest.notes) std::fprintf(stderr, "llmpi-prep: %s\n", n.c_str());
  for (const std::string& f : dest.leftovers) {
    std::fprintf(stderr, "llmpi-prep: note: removing '%s', left by an interrupted llmpi-prep run\n", f.c_str());
    std::error_code ec;
    fs::remove_all(f, ec);
    if (ec) fail("cannot remove '", f, "': ", ec.message(), "; remove it by hand");
  }
  ClassificationAttrs attrs;
  attrs.vocab_size = tok.vocab_size;
  attrs.num_labels = int(task.labels.size());
  for (const GlueLabel& l : task.labels) attrs.label_names.push_back(l.name);
  attrs.pad_id = pad_id;
  attrs.tokenizer = tok.description;
  attrs.created_by = "llmpi-prep glue";

  // A data set generation (data/prep_manifest.h): both files under names the current manifest does
  // not use, then the manifest (the switch), then the previous generation's files go. Killed at any
  // point, the directory holds the old pair or the new one, never a mix.
  PrepManifest man;
  man.generation = dest.next_generation;
  man.created_by = "llmpi-prep glue";
  man.tokenizer = tok.description;
  man.vocab_size = tok.vocab_size;
  man.eot_id = -1;
  std::vector<std::string> written;
  std::map<std::string, std::string> paths;  // split -> the file written for it
  try {
    for (const auto& [split, examples] : {std::pair<std::string, const ClassificationExamples*>{"train", &train},
                                          {"dev", &dev}}) {
      const std::string file = shard_file_name(split, 0, 1, man.generation);
      const std::string path = (fs::path(o.out) / file).string();
      write_classification_file(path, *examples, attrs);
      written.push_back(path);
      prep_crash_point(("after-" + split).c_str());
      const ClassificationInfo info = open_classification_file_info(path);
      SplitEntry e;
      e.kind = kClassificationSplitKind;
      e.shards = {{file, info.n_examples, info.content_hash}};
      e.size = e.documents = info.n_examples;
      e.content_hash = split_content_hash(e.shards);
      man.splits[split] = e;
      paths[split] = path;
    }
    write_prep_manifest_v2(o.out, man);
    prep_crash_point("after-switch");
  } catch (...) {
    for (const std::string& f : written) std::remove(f.c_str());
    throw;
  }
  const std::vector<std::string> keep = man.files();
  for (const std::string& f : dest.manifest ? dest.manifest->files() : std::vector<std::string>())
    if (std::find(keep.begin(), keep.end(), f) == keep.end()) std::remove((fs::path(o.out) / f).c_str());
  const std::string train_path = paths["train"], dev_path = paths["dev"];

  auto truncated = [&](const ClassificationExamples& e) {
    int64_t n = 0;
    for (int64_t i = 0; i < e.size(); i++) n += e.attention_mask[size_t((i + 1) * e.seq_len - 1)];
    return n;  // examples whose last position is a real token: filled, most of them truncated
  };
  std::printf("llmpi-prep glue: task %s, tokenizer %s (vocab %d, pad %lld), max length %d\n",
              task.name.c_str(), tok.description.c_str(), tok.vocab_size, (long long)pad_id,
              o.max_seq_len);
  std::printf("  train: %6lld examples (%lld fill all %d positions) -> %s\n", (long long)train.size(),
              (long long)truncated(train), o.max_seq_len, train_path.c_str());
  std::printf("  dev:   %6lld examples (%lld fill all %d positions) -> %s\n", (long long)dev.size(),
              (long long)truncated(dev), o.max_seq_len, dev_path.c_str());
  std::string names;
  for (const GlueLabel& l : task.labels) names += (names.empty() ? "" : ", ") + l.name;
  std::printf("  labels: %s; manifest: %s\n", names.c_str(),
              (fs::path(o.out) / kPrepManifestName).string().c_str());
}

}  // namespace llmpi
