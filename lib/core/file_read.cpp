// Bounded, non-blocking reading of input files (see file_read.h).
#include "lib/core/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gradscale {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

// Closes a file descriptor at scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

BoundedRead read_bounded(const std::string& path, std::size_t max_bytes) {
  BoundedRead r;
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
    r.problem = ReadProblem::cannot_open;
    r.detail = std::strerror(errno);
    return r;
  }
  if (S_ISDIR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    r.problem = ReadProblem::not_regular;
    r.detail = kind_of(st.st_mode);
    return r;
  }
  if (S_ISREG(st.st_mode) && static_cast<std::size_t>(st.st_size) > max_bytes) {
    r.problem = ReadProblem::too_large;
    return r;
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd.get(), buf, sizeof buf);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      r.problem = ReadProblem::read_error;
      r.detail = std::strerror(errno);
      return r;
    }
    r.text.append(buf, static_cast<std::size_t>(got));
    if (r.text.size() > max_bytes) {
      r.problem = ReadProblem::too_large;
      r.text.clear();
      return r;
    }
  }
  return r;
}

std::string read_problem_message(const BoundedRead& r, const std::string& what, const std::string& path,
                                 std::size_t max_bytes) {
  switch (r.problem) {
    case ReadProblem::none:
      return "";
    case ReadProblem::cannot_open:
      return what + ": cannot open '" + path + "': " + r.detail;
    case ReadProblem::not_regular:
      return what + " '" + path + "' is a " + r.detail + ", not a regular file";
    case ReadProblem::too_large:
      return what + " '" + path + "' is larger than " + std::to_string(max_bytes >> 20) + " MiB";
    case ReadProblem::read_error:
      return what + ": cannot read '" + path + "': " + r.detail;
  }
  return what + ": cannot read '" + path + "'";
}

}  // namespace gradscale
