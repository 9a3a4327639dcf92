// The --out directory of `gradscale ablate`, which the ablation owns: a marker file written when the
// directory is claimed says it is an ablation directory (an existing directory without it is refused
// unless empty, so ablate never empties or overwrites files it did not write), and an advisory lock
// (flock) is held for the whole command, so two ablations never run in one directory at once. Shards
// of one ablation (--shard K/N, shard.h) share the directory: each holds that lock shared and its own
// shard lock exclusive, and the runner locks each run while it runs it (RunLock), so two processes in
// one directory never write the same run.
#pragma once

#include <string>

#include "experiments/ablate/shard.h"

namespace gradscale::ablate {

// The marker and the lock file, inside the --out directory.
inline constexpr const char* kMarkerFile = ".gradscale-ablation";
inline constexpr const char* kLockFile = ".gradscale-ablation.lock";
// The shard locks (".gradscale-ablation.shard-K-of-N.lock") and the run locks (in this directory) start
// with kMarkerFile too: a directory holding only such files is still empty for the claim.
inline constexpr const char* kRunLockDir = ".gradscale-ablation.run-locks";

// Holds the lock of one --out directory for its lifetime.
class OutDirLock {
 public:
  // Claims `dir`. With `create`: a missing directory is created, an empty one claimed (the marker is
  // written), and the lock taken; when another process holds it, throws ConfigError naming that
  // process's pid. Without (--table-only): the directory must carry the marker, and no lock is taken
  // (the tables may be rebuilt while the ablation runs). Refuses an empty path, a path that is not a
  // directory and a non-empty directory without the marker (ConfigError naming the directory).
  // With a shard other than all (create only): the directory lock is taken shared — shards of one
  // ablation coexist, an ablation without --shard excludes them all — and the shard's own lock
  // exclusive (the same K/N twice at once is refused, naming the holder's pid).
  OutDirLock(const std::string& dir, bool create, const Shard& shard = Shard{});
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  int fd_ = -1;
  int shard_fd_ = -1;
};

// The lock of one run while a process runs it: DIR/kRunLockDir/<name>.lock, flock'ed exclusive.
class RunLock {
 public:
  // Tries to take it: held() says whether this process now owns the run; when not, holder() is the pid
  // of the process that does ("?" when unreadable). Throws DataError when the lock file cannot be made.
  RunLock(const std::string& out_dir, const std::string& run_name);
  ~RunLock();
  RunLock(RunLock&& other) noexcept : fd_(other.fd_), holder_(std::move(other.holder_)) { other.fd_ = -1; }
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  bool held() const { return fd_ >= 0; }
  const std::string& holder() const { return holder_; }

 private:
  int fd_ = -1;
  std::string holder_;
};

// Refuses (ConfigError) an ablation file that lies inside the --out directory `dir`, which ablate
// writes: the input is never written.
void check_input_outside(const std::string& file, const std::string& dir);

}  // namespace gradscale::ablate
