// Who owns a run directory, and what happens to a run that is already in it.
//
//   lock      run.dir/LOCK, runtime/dir_lock.h's lock, taken by rank 0 for the life of the run: a
//             second run in the same directory fails at start-up with an error naming the holder
//             (host, pid); a stale lock (its holder died) is taken over with a message.
//   new runs  a run started without --resume in a directory that already holds one (checkpoints,
//             or a non-empty metrics.jsonl / eval.jsonl) is refused, naming the ways out:
//             --resume auto, another run.dir, or --overwrite, which moves the earlier run's files
//             into run.dir/previous-YYYYmmdd-HHMMSS/ (UTC; nothing is deleted).
//   lineage   every run has an id, stored in its checkpoints and kept across resumes; pruning
//             (checkpoint.keep) removes only checkpoints of the run's own lineage.
#pragma once
#include <memory>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/dir_lock.h"

namespace llmpi {

// The files a run writes into run.dir (what --overwrite moves aside). trace-rank*.json and the
// TensorBoard event files (events.out.tfevents.*) too.
extern const char* const kRunFiles[];

// run.dir/LOCK (fd -1: not held: a file system without locks).
using RunDirLock = DirLock;

struct RunDirClaim {
  std::unique_ptr<RunDirLock> lock;  // held for the life of the run (null: nothing claimed)
  std::vector<std::string> notes;    // lines for rank 0 to print (lock taken over, files moved aside)
};

// Rank 0 at start-up. Creates `dir` (writes) or only inspects it (dry_run: creates nothing and
// takes no lock, but reports a directory in use or an earlier run exactly as a real start would).
// Throws Error naming the holder, or the earlier run and the ways out.
RunDirClaim claim_run_dir(const std::string& dir, bool resuming, bool overwrite, bool dry_run);

// What dir holds of an earlier run, e.g. "3 checkpoints (newest step 40), metrics.jsonl (40 lines)";
// "" when it holds none.
std::string describe_existing_run(const std::string& dir);

// Move the run files of dir into a new dir/previous-YYYYmmdd-HHMMSS[-N]/; returns that folder.
std::string move_run_aside(const std::string& dir);

// A new random lineage id (16 hex digits).
std::string new_lineage_id();

// mkdir -p: creates dir and its parents; an error names the part that could not be made.
void make_dirs(const std::string& dir);

// Keep only the lines of a JSON Lines file whose "step" passes `keep` (a resumed run drops what
// the interrupted run logged after its last checkpoint, so each step appears once); atomic.
void trim_jsonl(const std::string& path, const std::function<bool(int64_t)>& keep);

}  // namespace llmpi
