#include "train/resume_contract.h"

#include <algorithm>

#include "runtime/error.h"

namespace llmpi {

void ResumeContract::add(const std::string& key, const nlohmann::json& was, const nlohmann::json& now) {
  if (was.is_null()) return;
  for (const ContractRow& r : rows)
    if (r.key == key) return;
  rows.push_back({key, was, now, ""});
}

ResumeContract resume_contract_rows(const CheckpointInfo& ckpt, const Config& cfg, const ModelDesc& desc,
                                    const std::string& data_json_now) {
  ResumeContract c;
  // The model description: everything that shapes the parameters or the function.
  nlohmann::json theirs = model_desc_json(ckpt.desc), ours = model_desc_json(desc);
  for (const char* k : {"init_std", "dropout", "attn_dropout"}) theirs.erase(k), ours.erase(k);
  for (auto& [k, v] : ours.items())
    c.add("model." + (k == "max_seq_len" ? std::string("seq_len") : k), theirs.contains(k) ? theirs[k] : nlohmann::json(),
          v);
  // The configuration the checkpoint stores (resolved).
  const nlohmann::json stored = nlohmann::json::parse(ckpt.config_json, nullptr, false);
  auto was = [&](const char* sec, const char* key) {
    if (stored.is_discarded() || !stored.contains(sec) || !stored[sec].contains(key)) return nlohmann::json();
    return stored[sec][key];
  };
  const nlohmann::json& now = *cfg.resolved;
  c.add("model.seq_len", was("model", "seq_len"), now["model"]["seq_len"]);
  c.add("train.global_batch", was("train", "global_batch"), now["train"]["global_batch"]);
  if (cfg.train.batch_per_rank > 0 && !c.rows.empty() && c.rows.back().key == "train.global_batch") {
    const int replicas = cfg.train.global_batch / cfg.train.batch_per_rank;
    c.rows.back().note = "train.batch_per_rank " + std::to_string(cfg.train.batch_per_rank) + " × " +
                         std::to_string(replicas) + " data-parallel replica" + (replicas > 1 ? "s" : "") +
                         ": the global batch follows the world size";
  }
  c.add("train.seed", was("train", "seed"), now["train"]["seed"]);
  c.add("train.drop_last", was("train", "drop_last"), now["train"]["drop_last"]);  // which samples each step reads
  // The data files by identity (tokenizer, content hash, size), not by path: a moved file is the
  // same data, a remade one is not. Checkpoints before dataset identities have no 'data'.
  const nlohmann::json data_was = nlohmann::json::parse(ckpt.data_json.empty() ? "null" : ckpt.data_json, nullptr, false);
  const nlohmann::json data_now = nlohmann::json::parse(data_json_now.empty() ? "null" : data_json_now, nullptr, false);
  if (data_was.is_object() && data_now.is_object())
    for (const char* split : {"train", "val"})  // (a run that drops its val file changes no sample)
      if (!data_now.value(split, nlohmann::json()).is_null())
        c.add(std::string("data.") + split, data_was.value(split, nlohmann::json()), data_now[split]);
  return c;
}

std::string describe_changes(const std::vector<ContractRow>& rows) {
  std::string s;
  for (const ContractRow& r : rows) s += (s.empty() ? "" : ", ") + r.key + " " + r.was.dump() + " -> " + r.now.dump();
  return s;
}

std::vector<ContractRow> check_resume_contract(const CheckpointInfo& ckpt, const ResumeContract& contract,
                                               const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides) {
    if (std::none_of(contract.rows.begin(), contract.rows.end(), [&](const ContractRow& r) { return r.key == o; })) {
      std::string keys;
      for (const ContractRow& r : contract.rows)
        if (r.key.rfind("model.", 0) != 0) keys += ", " + r.key;
      fail("--resume-override '", o, "' names no key that resuming checks (model.*", keys,
           "): give one of those keys");
    }
  }
  std::vector<ContractRow> refused, accepted;
  for (const ContractRow& r : contract.rows) {
    if (!r.changed()) continue;
    const bool ok = std::find(overrides.begin(), overrides.end(), r.key) != overrides.end();
    (ok ? accepted : refused).push_back(r);
  }
  if (refused.empty()) return accepted;
  const ContractRow& f = refused.front();
  std::string also;
  auto now_of = [](const ContractRow& r) { return r.now.dump() + (r.note.empty() ? "" : " (" + r.note + ")"); };
  for (size_t i = 1; i < refused.size(); i++)
    also += (also.empty() ? "" : ", ") + refused[i].key + " " + refused[i].was.dump() + " vs " + now_of(refused[i]);
  const bool model_changed = std::any_of(refused.begin(), refused.end(),
                                         [](const ContractRow& r) { return r.key.rfind("model.", 0) == 0; });
  std::string way_out = "resume with the configuration the checkpoint was made with (stored in it, and in the run's "
                        "config.json), or start a new run.dir";
  if (!model_changed) {
    std::string flags;
    for (const ContractRow& r : refused) flags += " --resume-override " + r.key;
    way_out += ", or accept the change deliberately with" + flags +
               " (samples will be skipped or repeated relative to an uninterrupted run)";
  }
  const auto per_rank = std::find_if(refused.begin(), refused.end(), [](const ContractRow& r) {
    return r.key == "train.global_batch" && !r.note.empty();
  });
  if (per_rank != refused.end())
    way_out += ", or keep the checkpoint's batch at this world size with --set train.global_batch=" +
               per_rank->was.dump() + " (which replaces train.batch_per_rank)";
  fail("checkpoint '", ckpt.path, "' was made for ", f.key, " ", f.was.dump(), ", but this configuration has ",
       now_of(f), also.empty() ? "" : " (also: " + also + ")", ": ", way_out);
}

}  // namespace llmpi
