// Claiming and locking the --out directory of an ablation (see out_dir.h). POSIX flock: the lock goes
// with the open file, so it ends when the process ends, however it ends.
#include "experiments/ablate/out_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "lib/core/command_files.h"
#include "lib/core/error.h"
#include "lib/core/output_path.h"

namespace gradscale::ablate {
namespace fs = std::filesystem;
namespace {

// Whether `dir` holds nothing but the ablation's own marker and lock files, and the write probes that
// a gradscale command puts in a directory for a moment (a second shard starting beside this one
// probes the directory before it takes its lock and writes the marker).
bool empty_but_ours(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kMarkerFile, 0) != 0 && name.rfind(kWriteProbePrefix, 0) != 0) return false;
  }
  return !ec;
}

// The pid written in the lock file by its holder ("?" when unreadable).
std::string holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos ? "?" : pid;
}

// Writes this process's pid into a lock file it holds (for the message of a second process).
void write_pid(int fd) {
  const std::string pid = std::to_string(::getpid()) + "\n";
  const bool written = ::ftruncate(fd, 0) == 0 &&
                       ::pwrite(fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
  (void)written;  // the pid is only for the message of a second process
}

}  // namespace

OutDirLock::OutDirLock(const std::string& dir, bool create, const Shard& shard) {
  GS_CHECK_CONFIG(!dir.empty(), "--out: the path is empty: give the ablation's directory");
  const fs::path d(dir);
  const fs::path marker = d / kMarkerFile;
  std::error_code ec;
  const bool exists = fs::exists(d, ec);
  GS_CHECK_CONFIG(!exists || fs::is_directory(d, ec), "--out '" << dir << "' is not a directory");
  bool marked = exists && fs::is_regular_file(marker, ec);
  if (!create) {
    // --table-only reads the runs and replaces only the tables (atomically): it may run beside the
    // ablation that holds the lock, which is what it is for (a table while a long ablation goes on).
    GS_CHECK_CONFIG(marked, "--table-only: '" << dir << "' is not an ablation directory (no " << kMarkerFile
                                              << " in it; nothing has run there)");
    return;
  }
  if (exists && !marked && !empty_but_ours(d)) {
    // Another gradscale ablate (a second shard started at the same moment) may have claimed the directory
    // since `marked` was read: it writes the marker before anything that is not its own lock or marker
    // file, so the marker read after the listing settles it.
    marked = fs::is_regular_file(marker, ec);
    GS_CHECK_CONFIG(marked, "--out '" << dir << "' is a directory that gradscale ablate did not "
                                      << "create (no " << kMarkerFile
                                      << " in it) and is not empty: refusing to write into it; "
                                         "give a new or empty directory");
  }
  check_output_dir(dir, "--out");
  const std::string lock = (d / kLockFile).string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  GS_CHECK_CONFIG(fd_ >= 0, "--out '" << dir << "': cannot open '" << lock << "': " << std::strerror(errno));
  if (::flock(fd_, (shard.all() ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    const int err = errno;
    const std::string pid = holder_pid(fd_);
    ::close(fd_);
    fd_ = -1;
    GS_CHECK_CONFIG(err != EWOULDBLOCK, "--out '" << dir << "' is in use by another gradscale ablate (pid "
                                                  << pid << (shard.all() ? "" : ", without --shard")
                                                  << "): wait for it to end");
    throw ConfigError("--out '" + dir + "': cannot lock '" + lock + "': " + std::strerror(err));
  }
  if (!shard.all()) {
    // The shard's own lock: the same K/N twice at once would run the same runs (one after the other,
    // through the run locks, but pointlessly): refused.
    const std::string own = (d / (std::string(kMarkerFile) + ".shard-" + std::to_string(shard.index) + "-of-" +
                                  std::to_string(shard.count) + ".lock"))
                                .string();
    shard_fd_ = ::open(own.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    GS_CHECK_CONFIG(shard_fd_ >= 0, "--out '" << dir << "': cannot open '" << own << "': " << std::strerror(errno));
    if (::flock(shard_fd_, LOCK_EX | LOCK_NB) != 0) {
      const std::string pid = holder_pid(shard_fd_);
      ::close(shard_fd_);
      shard_fd_ = -1;
      ::close(fd_);
      fd_ = -1;
      throw ConfigError("--out '" + dir + "': shard " + shard.label() +
                        " is already running there (pid " + pid + "): wait for it to end");
    }
    write_pid(shard_fd_);
  }
  write_pid(fd_);
  if (!marked) write_file_atomic(marker.string(), "gradscale ablation directory (gradscale ablate --out)\n");
}

OutDirLock::~OutDirLock() {
  if (shard_fd_ >= 0) ::close(shard_fd_);
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

RunLock::RunLock(const std::string& out_dir, const std::string& run_name) {
  const fs::path dir = fs::path(out_dir) / kRunLockDir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (dir / (run_name + ".lock")).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  GS_CHECK_DATA(fd >= 0, "cannot open the run lock '" << path << "': " << std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    holder_ = holder_pid(fd);
    ::close(fd);
    return;
  }
  write_pid(fd);
  fd_ = fd;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);
}

void check_input_outside(const std::string& file, const std::string& dir) {
  CommandFiles files;
  files.input(file, "the ablation file");
  files.directory(dir, "--out", [](const std::string&) { return true; }, /*writes=*/true);
  files.check();
}

}  // namespace gradscale::ablate
