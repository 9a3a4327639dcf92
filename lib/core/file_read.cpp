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

// A descriptor opened for bounded reading, closed at scope exit.
class Fd {
 public:
  Fd() = default;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

  // Opens `path` non-blocking and refuses what is not a regular file or device, or a regular file
  // over `max_bytes`. Returns the problem (none when the descriptor is ready to read).
  ReadProblem open(const std::string& path, std::size_t max_bytes, std::string& detail) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0) {
      detail = std::strerror(errno);
      return ReadProblem::cannot_open;
    }
    if (S_ISDIR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
      detail = kind_of(st.st_mode);
      return ReadProblem::not_regular;
    }
    if (S_ISREG(st.st_mode) && static_cast<std::size_t>(st.st_size) > max_bytes)
      return ReadProblem::too_large;
    return ReadProblem::none;
  }

  // Reads up to `size` bytes; 0 at the end. Returns -1 with `detail` set when the read fails.
  ssize_t read(char* into, std::size_t size, std::string& detail) const {
    for (;;) {
      const ssize_t got = ::read(fd_, into, size);
      if (got >= 0) return got;
      if (errno == EINTR) continue;
      detail = std::strerror(errno);
      return -1;
    }
  }

 private:
  int fd_ = -1;
};

}  // namespace

BoundedRead read_bounded(const std::string& path, std::size_t max_bytes) {
  BoundedRead r;
  Fd fd;
  r.problem = fd.open(path, max_bytes, r.detail);
  if (r.problem != ReadProblem::none) return r;
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = fd.read(buf, sizeof buf, r.detail);
    if (got == 0) break;
    if (got < 0) {
      r.problem = ReadProblem::read_error;
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

// The stream buffer of BoundedFile: 64 KiB at a time from the descriptor, ending at the cap.
class BoundedFile::Buffer : public std::streambuf {
 public:
  Buffer(const std::string& path, std::size_t max_bytes) : max_bytes_(max_bytes) {
    problem_ = fd_.open(path, max_bytes, detail_);
    setg(data_, data_, data_);
  }
  ReadProblem problem() const { return problem_; }
  const std::string& detail() const { return detail_; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (problem_ != ReadProblem::none) return traits_type::eof();
    const ssize_t got = fd_.read(data_, sizeof data_, detail_);
    if (got < 0) problem_ = ReadProblem::read_error;
    if (got <= 0) return traits_type::eof();
    total_ += static_cast<std::size_t>(got);
    if (total_ > max_bytes_) {
      problem_ = ReadProblem::too_large;
      return traits_type::eof();
    }
    setg(data_, data_, data_ + got);
    return traits_type::to_int_type(*gptr());
  }

 private:
  Fd fd_;
  std::size_t max_bytes_;
  std::size_t total_ = 0;
  ReadProblem problem_ = ReadProblem::none;
  std::string detail_;
  char data_[1 << 16];
};

BoundedFile::BoundedFile(const std::string& path, std::size_t max_bytes)
    : buffer_(std::make_unique<Buffer>(path, max_bytes)), stream_(buffer_.get()) {}

BoundedFile::~BoundedFile() = default;

ReadProblem BoundedFile::problem() const {
  return buffer_->problem();
}

const std::string& BoundedFile::detail() const {
  return buffer_->detail();
}

std::string read_problem_message(const BoundedRead& r, const std::string& what, const std::string& path,
                                 std::size_t max_bytes) {
  return read_problem_message(r.problem, r.detail, what, path, max_bytes);
}

std::string read_problem_message(ReadProblem problem, const std::string& detail, const std::string& what,
                                 const std::string& path, std::size_t max_bytes) {
  switch (problem) {
    case ReadProblem::none:
      return "";
    case ReadProblem::cannot_open:
      return what + ": cannot open '" + path + "': " + detail;
    case ReadProblem::not_regular:
      return what + " '" + path + "' is a " + detail + ", not a regular file";
    case ReadProblem::too_large:
      return what + " '" + path + "' is larger than " + std::to_string(max_bytes >> 20) + " MiB";
    case ReadProblem::read_error:
      return what + ": cannot read '" + path + "': " + detail;
  }
  return what + ": cannot read '" + path + "'";
}

}  // namespace gradscale
