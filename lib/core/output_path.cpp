// Output path checks and the atomic file write (see output_path.h). POSIX calls where the standard
// library has no equivalent: O_EXCL creation of the temp file, fsync of the file and its directory.
#include "lib/core/output_path.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "lib/core/command_files.h"
#include "lib/core/error.h"

namespace gradscale {
namespace fs = std::filesystem;
namespace {

// Where a write to `path` lands: a symlink is followed to its target, a dangling one too (the write
// creates the target, as the collision check of command_files.h assumes).
fs::path resolve(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) return real_path(path);
  return fs::path(path);
}

fs::path directory_of(const fs::path& file) {
  return file.has_parent_path() ? file.parent_path() : fs::path(".");
}

const char* kind_of(const fs::file_status& s) {
  switch (s.type()) {
    case fs::file_type::directory:
      return "directory";
    case fs::file_type::fifo:
      return "FIFO";
    case fs::file_type::character:
      return "character device";
    case fs::file_type::block:
      return "block device";
    case fs::file_type::socket:
      return "socket";
    default:
      return "special file";
  }
}

// A file created by this process under a unique name; removed when destroyed unless released.
class TempFile {
 public:
  // Creates "<dir>/<prefix>-<pid>-<n>" with O_EXCL; on failure fd() < 0 and error() says why.
  TempFile(const fs::path& dir, const std::string& prefix) {
    static std::atomic<unsigned long> counter{0};
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const fs::path p =
          dir / (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)));
      fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) {
        path_ = p;
        return;
      }
      error_ = errno;
      if (error_ != EEXIST) return;
    }
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }
  const char* error() const { return std::strerror(error_); }
  // Closes the file; false (errno set) when the close reports a write error.
  bool close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0;
  }
  void release() { path_.clear(); }  // renamed into place: no longer ours to remove

 private:
  int fd_ = -1;
  int error_ = 0;
  fs::path path_;
};

bool write_all(int fd, const std::string& contents) {
  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

// Makes a rename in `dir` durable; best effort (some file systems cannot fsync a directory).
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Creates the directory when missing and tries to create a file in it.
void check_writable_directory(const fs::path& dir, const std::string& what, const std::string& path) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  GS_CHECK_CONFIG(fs::is_directory(dir), what << " '" << path << "': cannot create the directory '"
                                              << dir.string() << "'"
                                              << (ec ? ": " + ec.message() : std::string()));
  const TempFile probe(dir, kWriteProbePrefix);
  GS_CHECK_CONFIG(probe.fd() >= 0, what << " '" << path << "': cannot create files in the directory '"
                                        << dir.string() << "': " << probe.error());
}

}  // namespace

std::string temp_name_prefix(const std::string& path) {
  return fs::path(path).filename().string() + ".tmp";
}

void check_output_file(const std::string& path, const std::string& what,
                       const std::vector<InputFile>& inputs) {
  GS_CHECK_CONFIG(!path.empty(), what << ": the path is empty");
  GS_CHECK_CONFIG(path.back() != '/', what << " '" << path << "' ends in '/': give a file name");
  const fs::path target = resolve(path);
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  if (fs::exists(st)) {
    GS_CHECK_CONFIG(fs::is_regular_file(st), what << " '" << path << "' is a " << kind_of(st)
                                                  << ", not a regular file: refusing to replace it");
    for (const auto& [input, name] : inputs) {
      std::error_code same_ec;
      GS_CHECK_CONFIG(input.empty() || !fs::equivalent(target, input, same_ec),
                      what << " '" << path << "' is " << name << ": refusing to overwrite an input");
    }
  }
  check_writable_directory(directory_of(target), what, path);
}

void check_output_dir(const std::string& dir, const std::string& what) {
  GS_CHECK_CONFIG(!dir.empty(), what << ": the path is empty");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  GS_CHECK_CONFIG(!fs::exists(st) || fs::is_directory(st),
                  what << " '" << dir << "' is a " << (fs::is_regular_file(st) ? "file" : kind_of(st))
                       << ", not a directory");
  check_writable_directory(dir, what, dir);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  GS_CHECK_DATA(!path.empty() && path.back() != '/',
                "cannot write a file at '" << path << "': not a file path");
  const fs::path target = resolve(path);
  const fs::path dir = directory_of(target);
  std::error_code ec;
  fs::create_directories(dir, ec);  // a failure shows as the failure to create the temp file
  TempFile tmp(dir, temp_name_prefix(target.string()));
  GS_CHECK_DATA(tmp.fd() >= 0, path << ": cannot create a file in '" << dir.string() << "': " << tmp.error());
  GS_CHECK_DATA(write_all(tmp.fd(), contents) && ::fsync(tmp.fd()) == 0 && tmp.close(),
                path << ": cannot write '" << tmp.path().string() << "': " << std::strerror(errno));
  GS_CHECK_DATA(
      ::rename(tmp.path().c_str(), target.c_str()) == 0,
      path << ": cannot rename '" << tmp.path().string() << "' into place: " << std::strerror(errno));
  tmp.release();
  sync_directory(dir);
}

}  // namespace gradscale
