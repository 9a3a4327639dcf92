// Bounded reading of an input file, the one way every file given by the user is read (configs,
// specs, ablation files, traces, the result files of an ablation): the file is opened non-blocking,
// so a FIFO never hangs the program; FIFOs, sockets and directories are refused; a device such as
// /dev/zero is read up to the size cap, which also bounds a regular file.
#pragma once

#include <cstddef>
#include <istream>
#include <memory>
#include <string>

namespace gradscale {

// Largest trace read (`gradscale inspect`, a resumed trace): traces grow with the run, so the cap is
// larger than that of a JSON config (kMaxJsonFileBytes).
inline constexpr std::size_t kMaxTraceFileBytes = std::size_t{256} << 20;

enum class ReadProblem { none, cannot_open, not_regular, too_large, read_error };

struct BoundedRead {
  std::string text;  // the bytes read (complete when problem == none)
  ReadProblem problem = ReadProblem::none;
  std::string detail;  // the system's reason, or the kind of file ("FIFO", "directory", ...)
};

// Reads the file at `path`, at most `max_bytes` bytes. Never blocks on a FIFO; never throws for a
// file problem (the result says what it was).
BoundedRead read_bounded(const std::string& path, std::size_t max_bytes);

// The same file read as a stream, for inputs too large to hold at once (traces): opened and checked
// as read_bounded opens and checks it; the stream ends early when `max_bytes` are passed or a read
// fails, and problem() then says why. Check problem() after opening and again after reading.
class BoundedFile {
 public:
  BoundedFile(const std::string& path, std::size_t max_bytes);
  ~BoundedFile();
  BoundedFile(const BoundedFile&) = delete;
  BoundedFile& operator=(const BoundedFile&) = delete;

  ReadProblem problem() const;
  const std::string& detail() const;
  std::istream& stream() { return stream_; }  // at its end at once when the file did not open

 private:
  class Buffer;
  std::unique_ptr<Buffer> buffer_;
  std::istream stream_;
};

// The problem as a message: "<what> '<path>' is a FIFO, not a regular file", "... cannot open ...:
// <reason>", "... is larger than N MiB". `what` names the file's role ("ablation file").
std::string read_problem_message(const BoundedRead& r, const std::string& what, const std::string& path,
                                 std::size_t max_bytes);
std::string read_problem_message(ReadProblem problem, const std::string& detail, const std::string& what,
                                 const std::string& path, std::size_t max_bytes);

}  // namespace gradscale
