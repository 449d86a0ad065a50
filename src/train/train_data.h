// One split of the training data (train or val) and the batches read from it, whatever the model
// family: a language model reads windows of a token file (data/token_file.h), a classifier
// examples of a classification file (data/classification_file.h).
//
//   language modelling  sample w is the window of seq_len + 1 tokens at w · seq_len (inputs, and
//                       targets shifted by one)
//   classification      sample i is example i
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/classification_file.h"
#include "data/dataset_identity.h"
#include "data/token_file.h"
#include "model/transformer.h"

namespace llmpi {

struct DataSplit {
  bool classification = false;
  int T = 0;
  TokenReader tokens_file;
  ClassificationReader examples_file;
  int64_t n_samples = 0;

  // Opens `path` for a model of `family` (a classifier reads a classification file); an Error
  // names a file of the wrong kind or of another sequence length, and the fix.
  void open(const std::string& path, Family family, int seq_len);
  int64_t vocab_size() const;
  DatasetIdentity identity() const;
  // The samples `ids`, as a batch whose pointers stay valid until the next read.
  Batch read(const std::vector<int64_t>& ids);

 private:
  std::vector<int32_t> window_, inputs_, targets_;
  ClassificationExamples examples_;
};

}  // namespace llmpi
