// GLUE sentence(-pair) tasks to classification files: what `llmpi-prep glue` does.
//
// A GLUE task folder (as the GLUE download script leaves it) holds train.tsv and dev.tsv:
// tab-separated, one example a line, fields split on tabs only — a quote is an ordinary character
// (70 RTE training sentences begin with one). The layout of each task is a row of the task table
// (glue_tasks()): whether the file has a header (and which), how many columns, which hold
// sentence 1, sentence 2 (none for single-sentence tasks) and the label, and the label values
// in the file with the name of each; label k is the k-th entry.
//
// Each example becomes, for a BERT tokenizer's template,
//   [CLS] s1 [SEP] s2 [SEP]    token types 0 ... 0 1 ... 1    (single sentence: [CLS] s1 [SEP])
// truncated "longest first" as transformers does (truncation=True): while the pair is longer than
// max_seq_len minus the template's special tokens, remove the last token of the longer sentence,
// of the second one when both are as long; then padded with pad_id to max_seq_len
// (attention_mask 0 there, token type 0).
//
// Errors (llmpi::Error, one message naming the file and line): a header that is not the task's,
// a line with another number of columns (a missing column), a label the task does not have.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/classification_file.h"
#include "tokenizer/tokenizer.h"

namespace llmpi {

struct GlueLabel {
  std::string in_file;  // the label as the TSV spells it: "entailment", "0", ...
  std::string name;     // what label_names records: "entailment", "not_equivalent", ...
};

struct GlueTask {
  std::string name;                  // "rte" (the --task value, lower case)
  std::string train_file, dev_file;  // inside --data-dir
  std::vector<std::string> header;   // the expected first line's columns; empty: no header line
  int n_columns = 0;                 // columns on every line
  int sentence1 = -1, sentence2 = -1, label = -1;  // 0-based columns; sentence2 -1: single sentence
  std::vector<GlueLabel> labels;     // label k = labels[k]
};

// The task table: rte, mrpc, sst-2, qnli, cola.
const std::vector<GlueTask>& glue_tasks();
// The task called `name` (case-insensitive); an Error listing the known tasks when there is none.
const GlueTask& find_glue_task(std::string_view name);

// Truncate a pair to at most max_total ids together, longest first (see above).
void truncate_longest_first(std::vector<uint32_t>& a, std::vector<uint32_t>& b, size_t max_total);

// The padding id of a BERT-style tokenizer: the id of "[PAD]" (an Error if it has none).
int64_t glue_pad_id(const Tokenizer& tok);

// Parse, tokenize and pad one GLUE TSV whose bytes are `content` (`path` is for messages).
ClassificationExamples glue_examples(const GlueTask& task, const std::string& path,
                                     std::string_view content, const Tokenizer& tok,
                                     int max_seq_len, int64_t pad_id);

struct GluePrepOptions {
  std::string task, data_dir, tokenizer, out;
  bool lowercase = false;
  int max_seq_len = 128;
  bool overwrite = false;  // write into a non-empty --out that holds no llmpi-prep data set
};

// llmpi-prep glue: a data set of two classification splits, OUT/manifest.json (version 2) naming
// OUT/train.h5 and OUT/dev.h5 (train.gG.h5 and dev.gG.h5 when it replaces an earlier data set;
// readers follow the manifest), switched in as one unit by the manifest's rename
// (data/prep_manifest.h). OUT must be new, empty or an llmpi-prep output unless o.overwrite.
// Prints a summary.
void run_glue_prep(const GluePrepOptions& o);

}  // namespace llmpi
