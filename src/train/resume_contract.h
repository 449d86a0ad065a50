// The resume contract: what must not change between a checkpoint and the configuration that
// resumes it, because a change would silently skip or repeat samples or compute another function.
//
//   model.family                 another family cannot be resumed at all
//   model.* (the description)    every field of the model description except init_std, dropout
//                                and attn_dropout (which may change); model.seq_len
//   train.global_batch           the sampler's position is (seed, step, global batch); with
//                                train.batch_per_rank the resolved one (runtime/config.h
//                                resolve_batch), so another world size is a changed global batch
//   train.seed                   the sample order and dropout masks follow from the seed
//   data.train, data.val         the identity of the training / validation file (tokenizer,
//                                content hash, size: data/dataset_identity.h), so a resume on
//                                changed data is refused unless overridden
//
// The check is a table of (key, value in the checkpoint, value now) rows; adding a compared
// quantity is one more `add` in resume_contract_rows(). A changed row is an error that names the
// key with both values, unless the user accepts it with --resume-override KEY; accepted changes
// are returned so the trainer can log them (stdout and the first metrics.jsonl line). Changing the
// world size with the same global batch is not a change: each rank takes its share of the same
// global batch.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/model_desc.h"
#include "runtime/config.h"

namespace llmpi {

struct ContractRow {
  std::string key;           // "train.global_batch"
  nlohmann::json was, now;   // in the checkpoint, in this configuration
  std::string note;          // where `now` comes from, when not from the key itself ("train.batch_per_rank 4 × 2 ...")
  bool changed() const { return was != now; }
};

struct ResumeContract {
  std::vector<ContractRow> rows;
  // Add a row (a key already present is kept as it is; a null `was`, a key older checkpoints do
  // not record, adds nothing).
  void add(const std::string& key, const nlohmann::json& was, const nlohmann::json& now);
};

// The rows for resuming checkpoint `ckpt` with configuration `cfg`, whose model is `desc`.
// `data_json_now` is the identity of this run's files, {"train": {...}, "val": {...}} (the
// trainer's Run::data_json, what save_checkpoint stores as ckpt.data_json); "" adds no data rows.
ResumeContract resume_contract_rows(const CheckpointInfo& ckpt, const Config& cfg, const ModelDesc& desc,
                                    const std::string& data_json_now = std::string());

// Throws Error for a changed row that `overrides` does not name (and for an override that names no
// row); returns the changed rows the overrides accept.
std::vector<ContractRow> check_resume_contract(const CheckpointInfo& ckpt, const ResumeContract& contract,
                                               const std::vector<std::string>& overrides);

// "train.global_batch 8 -> 16, train.seed 1 -> 2"
std::string describe_changes(const std::vector<ContractRow>& rows);

}  // namespace llmpi
