#include "train/train_data.h"

#include "data/h5_util.h"
#include "runtime/error.h"

namespace llmpi {

void DataSplit::open(const std::string& path, Family family, int seq_len) {
  classification = family == Family::bert;
  T = seq_len;
  const std::string format = hdf5_format_of(path);
  if (classification) {
    if (format == kTokenFileFormat)
      fail("'", path, "' is a language-modelling token file, but model.family bert trains a classifier on a "
           "classification file (input_ids, token_type_ids, attention_mask, labels): make one with "
           "`llmpi-prep glue`, or choose model.family gpt2 or llama");
    examples_file.open(path);
    if (examples_file.info().seq_len != T)
      fail("'", path, "' holds sequences of ", examples_file.info().seq_len, " tokens but model.seq_len is ", T,
           ": set model.seq_len to ", examples_file.info().seq_len);
    n_samples = examples_file.info().n_examples;
  } else {
    if (format == "llmpi-classification")
      fail("'", path, "' is a classification file, but model.family ", "gpt2/llama", " trains a language model on "
           "a token file made by `llmpi-prep`: choose model.family bert, or give a token file");
    tokens_file.open(path);
    n_samples = (tokens_file.n_tokens() - 1) / T;
  }
}

int64_t DataSplit::vocab_size() const {
  return classification ? examples_file.info().vocab_size : tokens_file.info().vocab_size;
}

DatasetIdentity DataSplit::identity() const {
  return classification ? dataset_identity(examples_file.info()) : dataset_identity(tokens_file.info());
}

Batch DataSplit::read(const std::vector<int64_t>& ids) {
  const size_t B = ids.size();
  Batch b;
  b.B = static_cast<int>(B);
  b.T = T;
  if (classification) {
    examples_file.read(ids, examples_);
    b.tokens = examples_.input_ids.data();
    b.token_types = examples_.token_type_ids.data();
    b.attn_mask = examples_.attention_mask.data();
    b.labels = examples_.labels.data();
    return b;
  }
  inputs_.resize(B * T);
  targets_.resize(B * T);
  window_.resize(T + 1);
  for (size_t i = 0; i < B; i++) {
    tokens_file.read(ids[i] * (int64_t)T, T + 1, window_.data());
    std::copy(window_.begin(), window_.begin() + T, inputs_.begin() + i * T);
    std::copy(window_.begin() + 1, window_.end(), targets_.begin() + i * T);
  }
  b.tokens = inputs_.data();
  b.targets = targets_.data();
  return b;
}

}  // namespace llmpi
