// llmpi-prep's main work, run by every rank of a communicator: text in (data/text_input.h), an
// llmpi-prep data set out (data/prep_manifest.h: DIR/manifest.json and the splits' token files).
//
//   1. Rank 0 takes --out's lock (refused when another llmpi-prep holds it) and checks --out
//      (open_prep_destination: new, empty, an llmpi-prep data set, or --overwrite), deletes what an
//      interrupted run left there, and divides the inputs into units. It holds the lock to the end.
//      The ranks share the units out: largest first, each to the least loaded rank.
//   2. Each rank tokenizes its units' documents into DIR/.llmpi-prep-work/: per unit its tokens
//      (every document preceded by eot_id) and each document's token count. Rank 0 prints progress
//      on stderr: all ranks' input read, MB/s and the time left.
//   3. The ranks sum the document counts: n documents, of which k = round(val_fraction * n) go to
//      validation, chosen by selection sampling over the document index i in input order (Knuth's
//      algorithm S): document i is a validation document when floor(u_i * (n - i)) < k - (validation
//      documents before i), u_i a 64-bit hash of (seed, i) read as a fraction of 2^64. Exactly k
//      documents, a function of the seed, n and i alone.
//   4. A split's stream is its documents in input order with eot_id between them (what one token
//      file has always held). It is cut into shards of exactly --shard-tokens tokens, the last one
//      shorter (a document may continue in the next shard: readers read the shards as one stream);
//      a split of at most --shard-tokens tokens is one file, DIR/train.h5 or DIR/val.h5. Shard j of
//      all shards (train's, then val's) is written by rank j mod N from the work files.
//   5. Rank 0 writes manifest.json (the switch from the previous data set to this one), then deletes
//      the previous data set's files and the work directory.
// The output depends on the inputs and options alone: not on the number of ranks, nor on
// --split-bytes. Memory per rank: the tokenizer, a read buffer, the longest document and its tokens,
// and copy buffers of about 8 MB; no shard is held whole. The work directory takes about as much
// disk as the output. Every rank must see the inputs and --out (a shared file system); streams
// (standard input, named pipes) are read by rank 0. (MPICH's mpiexec forwards standard input only
// while rank 0 keeps up with it, so under mpiexec give a named pipe instead of "-".)
//
// Failure: every rank throws an Error with the same message (the first failing rank's), before the
// switch leaving the previous data set as it was and deleting the new files. A test hook,
// LLMPI_PREP_TEST_CRASH=after-first-shard|before-manifest|after-switch|during-cleanup, kills the
// process (SIGKILL) at that point, so tests can check what an interrupted run leaves.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace llmpi {

inline constexpr int64_t kDefaultShardTokens = 1000000000;  // one file per split up to 1G tokens
inline constexpr int64_t kDefaultSplitBytes = int64_t(64) << 20;
inline constexpr int64_t kMaxShardsPerSplit = 99999;

struct TokenPrepOptions {
  std::string tokenizer;  // byte | gpt2 | hf:PATH | wordpiece:PATH
  std::string gpt2_encoder, gpt2_merges;
  bool lowercase = false;  // wordpiece:PATH only
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.05;
  std::string input_format = "auto";      // auto | text | jsonl
  std::string split_docs = "blank-line";  // blank-line | file
  uint64_t seed = 1234;
  bool allow_special = false;
  int64_t shard_tokens = kDefaultShardTokens;
  int64_t split_bytes = kDefaultSplitBytes;
  bool overwrite = false;
};

// Collective over comm. Prints progress (stderr) and a summary (stdout) on rank 0.
void run_token_prep(const TokenPrepOptions& o, MPI_Comm comm);

// Step 3's choice of validation documents.
struct ValidationChoice {
  int64_t n = 0, k = 0;  // documents, validation documents
  uint64_t seed = 0;
  // Is document i a validation document, given `chosen` of documents [0, i) were?
  bool is_val(int64_t i, int64_t chosen) const;
};

}  // namespace llmpi
