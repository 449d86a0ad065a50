// Who owns a directory: an advisory lock that one process holds while it writes there (llmpi-train's
// run.dir, train/run_dir.h; llmpi-prep's --out, data/prep_manifest.h).
//
//   DIR/NAME  a file locked with flock(2) for as long as the holder works in DIR; it names the holder
//             ("host H", "pid P", "started T" lines). A second process that asks for it fails at
//             once with an error naming that holder, the setting to change and the file to delete
//             if the holder is known to be gone.
//   stale     a process that died released its flock with it, so the next one simply gets the lock
//             (and says whose it takes over when the file still names a holder); a lock that is
//             still held but names a pid on this host that no longer exists (a child that inherited
//             the descriptor) is replaced by a new file. The holder removes the file when it ends.
//   no locks  a file system without lock support (flock fails with ENOLCK, EOPNOTSUPP, ...) gets a
//             warning, not an error: ownership cannot be enforced there.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace llmpi {

struct DirLock {
  std::string path;  // DIR/NAME
  int fd = -1;       // -1: not held (a probe, or a file system without locks)
  DirLock() = default;
  ~DirLock();        // removes the file and releases the lock
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
};

// How a lock's messages name things, e.g. for llmpi-train {"run.dir", "run directory", "run",
// "a run", "two runs in one directory would mix their logs and checkpoints"}.
struct DirLockWords {
  std::string setting;  // the setting that names the directory ("run.dir", "--out")
  std::string kind;     // the directory, as in "the run directory lock"
  std::string user;     // one holder, as in "in use by another run"
  std::string a_user;   // the same with its article ("a run", "an llmpi-prep run")
  std::string clash;    // what two holders at once would do (the refusal's reason)
};

// Take DIR/name, which must be a writable directory. Returns the held lock (fd -1 on a file system
// without locks, with a warning in `notes`). probe_only: take nothing (returns null), but refuse a
// held lock exactly as taking it would. Throws Error naming the holder (host, pid, start), the ways
// out and the file to delete. `notes` gets the lines to print: a stale lock taken over, no locks.
std::unique_ptr<DirLock> lock_dir(const std::string& dir, const std::string& name, const DirLockWords& words,
                                  bool probe_only, std::vector<std::string>& notes);

// The host name (for lock files and messages).
std::string host_name();

}  // namespace llmpi
