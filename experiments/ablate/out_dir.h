// The --out directory of `gradscale ablate`, which the ablation owns: a marker file written when the
// directory is claimed says it is an ablation directory (an existing directory without it is refused
// unless empty, so ablate never empties or overwrites files it did not write), and an advisory lock
// (flock) is held for the whole command, so two ablations never run in one directory at once.
#pragma once

#include <string>

namespace gradscale::ablate {

// The marker and the lock file, inside the --out directory.
inline constexpr const char* kMarkerFile = ".gradscale-ablation";
inline constexpr const char* kLockFile = ".gradscale-ablation.lock";

// Holds the lock of one --out directory for its lifetime.
class OutDirLock {
 public:
  // Claims `dir`. With `create`: a missing directory is created, an empty one claimed (the marker is
  // written), and the lock taken; when another process holds it, throws ConfigError naming that
  // process's pid. Without (--table-only): the directory must carry the marker, and no lock is taken
  // (the tables may be rebuilt while the ablation runs). Refuses an empty path, a path that is not a
  // directory and a non-empty directory without the marker (ConfigError naming the directory).
  OutDirLock(const std::string& dir, bool create);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Refuses (ConfigError) an ablation file that lies inside the --out directory `dir`, which ablate
// writes: the input is never written.
void check_input_outside(const std::string& file, const std::string& dir);

}  // namespace gradscale::ablate
