// The IDX reader (see idx.h). Gzip is inflated with zlib's inflate() rather than gzread(): gzread
// silently ignores anything after the end of a gzip stream, and trailing data must be an error here.
#include "lib/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <utility>

#include "lib/core/error.h"

namespace gradscale {
namespace {

constexpr std::size_t kInputBufferBytes = std::size_t{1} << 20;
// The payload buffer starts this large and doubles as data arrives: a header that lies about the size
// costs at most this much (the fuzzer found 64 MiB zero-filled for a 20-byte file).
constexpr std::size_t kPayloadChunkBytes = std::size_t{1} << 20;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// The bytes of one file, in order: inflated when the file starts with the gzip magic bytes, as stored
// otherwise. Owns the file handle and the zlib state (released by the destructor).
class ByteSource {
 public:
  explicit ByteSource(std::string path) : path_(std::move(path)), in_(kInputBufferBytes) {
    errno = 0;
    file_.reset(std::fopen(path_.c_str(), "rb"));
    GS_CHECK_DATA(file_ != nullptr, path_ << ": cannot open: " << std::strerror(errno));
    fill();
    gzip_ = available() >= 2 && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b;
    if (gzip_) {
      std::memset(&zs_, 0, sizeof zs_);
      GS_CHECK_DATA(inflateInit2(&zs_, MAX_WBITS + 16) == Z_OK, path_ << ": cannot initialise zlib");
      inflating_ = true;
    }
  }
  ~ByteSource() {
    if (inflating_) inflateEnd(&zs_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  const std::string& path() const { return path_; }

  // Reads up to n bytes into dst; returns fewer only at the end of the data.
  std::size_t read(std::uint8_t* dst, std::size_t n) {
    return gzip_ ? read_gzip(dst, n) : read_plain(dst, n);
  }

  // Reads and discards everything left; returns how many bytes that was.
  std::uint64_t skip_rest() {
    std::vector<std::uint8_t> scratch(std::size_t{1} << 16);
    std::uint64_t total = 0;
    for (;;) {
      const std::size_t got = read(scratch.data(), scratch.size());
      total += got;
      if (got < scratch.size()) return total;
    }
  }

  // True once the compressed data has ended inside a gzip member (no end marker and CRC trailer).
  bool gzip_truncated() const { return gzip_truncated_; }

 private:
  std::size_t available() const { return len_ - pos_; }

  // Moves the unread input to the front of the buffer and appends what the file has; false when
  // nothing could be added (end of file).
  bool fill() {
    if (pos_ > 0) {
      std::memmove(in_.data(), in_.data() + pos_, available());
      len_ -= pos_;
      pos_ = 0;
    }
    if (eof_ || len_ == in_.size()) return false;
    const std::size_t want = in_.size() - len_;
    const std::size_t got = std::fread(in_.data() + len_, 1, want, file_.get());
    if (got < want) {
      GS_CHECK_DATA(!std::ferror(file_.get()), path_ << ": read error: " << std::strerror(errno));
      eof_ = true;
    }
    len_ += got;
    return got > 0;
  }

  std::size_t read_plain(std::uint8_t* dst, std::size_t n) {
    std::size_t got = std::min(n, available());
    std::memcpy(dst, in_.data() + pos_, got);
    pos_ += got;
    if (got < n && !eof_) {  // large reads go straight from the file into dst
      const std::size_t more = std::fread(dst + got, 1, n - got, file_.get());
      if (more < n - got) {
        GS_CHECK_DATA(!std::ferror(file_.get()), path_ << ": read error: " << std::strerror(errno));
        eof_ = true;
      }
      got += more;
    }
    return got;
  }

  std::uint64_t raw_bytes_left() {
    std::uint64_t left = available();
    pos_ = len_;
    while (fill()) {
      left += available();
      pos_ = len_;
    }
    return left;
  }

  std::size_t read_gzip(std::uint8_t* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      if (member_done_) {  // between gzip members: the end of the data, another member, or garbage
        if (available() < 2) fill();
        if (available() == 0) break;
        const bool next_member = available() >= 2 && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b;
        GS_CHECK_DATA(next_member, path_ << ": trailing data: " << raw_bytes_left()
                                         << " bytes after the end of the gzip stream");
        inflateReset(&zs_);
        member_done_ = false;
      }
      if (available() == 0) fill();
      const std::size_t in_before = available();
      const std::size_t want = std::min<std::size_t>(n - got, std::size_t{1} << 30);
      zs_.next_in = in_.data() + pos_;
      zs_.avail_in = static_cast<uInt>(in_before);
      zs_.next_out = dst + got;
      zs_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      pos_ += in_before - zs_.avail_in;
      got += want - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        member_done_ = true;
        continue;
      }
      if (rc == Z_BUF_ERROR && available() == 0 && eof_) {
        gzip_truncated_ = true;  // no input left, and the member has not ended
        break;
      }
      // Z_BUF_ERROR otherwise only means "no progress without more input": the next round reads more.
      GS_CHECK_DATA(
          rc == Z_OK || rc == Z_BUF_ERROR,
          path_ << ": corrupt gzip data (zlib: " << (zs_.msg ? zs_.msg : "error") << ", code " << rc << ")");
    }
    return got;
  }

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::vector<std::uint8_t> in_;
  std::size_t pos_ = 0;
  std::size_t len_ = 0;
  bool eof_ = false;
  bool gzip_ = false;
  bool inflating_ = false;
  bool member_done_ = false;
  bool gzip_truncated_ = false;
  z_stream zs_{};
};

std::uint32_t big_endian_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

// Reads and checks the magic number and the dimension sizes; `what` names the content ("images").
std::vector<std::int64_t> read_header(ByteSource& src, std::uint32_t expected_magic, const char* what) {
  const int dims = static_cast<int>(expected_magic & 0xFF);
  std::uint8_t head[4 * 4];
  std::size_t got = src.read(head, 4);
  GS_CHECK_DATA(got == 4,
                src.path() << ": truncated: expected a 4-byte magic number, got " << got << " bytes");
  const std::uint32_t magic = big_endian_u32(head);
  const std::string expected =
      hex32(expected_magic) + " (IDX, unsigned bytes, " + std::to_string(dims) + " dimensions: " + what + ")";
  GS_CHECK_DATA((magic >> 16) == 0, src.path() << ": bad magic number " << hex32(magic) << ": expected "
                                               << expected << "; is this an IDX file?");
  GS_CHECK_DATA(((magic >> 8) & 0xFF) == 0x08, src.path() << ": unsupported element type "
                                                          << hex32((magic >> 8) & 0xFF) << " (magic number "
                                                          << hex32(magic) << "): expected " << expected);
  GS_CHECK_DATA(static_cast<int>(magic & 0xFF) == dims,
                src.path() << ": wrong number of dimensions: " << (magic & 0xFF) << " (magic number "
                           << hex32(magic) << "): expected " << expected);
  const std::size_t size_bytes = 4 * static_cast<std::size_t>(dims);
  got = src.read(head, size_bytes);
  GS_CHECK_DATA(got == size_bytes, src.path() << ": truncated: expected a " << 4 + size_bytes
                                              << "-byte header, got " << 4 + got << " bytes");
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(dims));
  for (int d = 0; d < dims; ++d) sizes[static_cast<std::size_t>(d)] = big_endian_u32(head + 4 * d);
  return sizes;
}

void check_range(const std::string& path, const char* name, std::int64_t value, std::int64_t limit) {
  GS_CHECK_DATA(value >= 1 && value <= limit, path << ": " << name << " " << value
                                                   << " in the header is out of range: expected 1.."
                                                   << limit);
}

// Reads exactly `expected` payload bytes followed by the end of the data.
std::vector<std::uint8_t> read_payload(ByteSource& src, std::uint64_t expected, const char* what) {
  std::vector<std::uint8_t> out;
  std::size_t got = 0;
  while (got < expected) {  // grows as data arrives, so a lying header cannot force a huge allocation
    const std::size_t target = static_cast<std::size_t>(
        std::min<std::uint64_t>(expected, got + std::max<std::size_t>(got, kPayloadChunkBytes)));
    out.resize(target);
    const std::size_t r = src.read(out.data() + got, target - got);
    got += r;
    if (got < target) break;
  }
  GS_CHECK_DATA(got == expected, src.path() << ": truncated: expected " << expected << " bytes of " << what
                                            << ", got " << got
                                            << (src.gzip_truncated() ? " (the gzip stream ends early)" : ""));
  const std::uint64_t extra = src.skip_rest();
  GS_CHECK_DATA(extra == 0, src.path() << ": trailing data: " << extra << " bytes after the " << expected
                                       << " bytes of " << what << " the header announces");
  GS_CHECK_DATA(!src.gzip_truncated(),
                src.path() << ": truncated gzip stream: the " << what
                           << " are complete but the stream ends before its end marker and CRC");
  return out;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  ByteSource src(path);
  const auto sizes = read_header(src, kIdxImagesMagic, "images");
  IdxImages out;
  out.path = path;
  out.count = sizes[0];
  out.rows = sizes[1];
  out.cols = sizes[2];
  check_range(path, "image count", out.count, kIdxMaxItems);
  check_range(path, "rows", out.rows, kIdxMaxSide);
  check_range(path, "columns", out.cols, kIdxMaxSide);
  const std::uint64_t bytes = static_cast<std::uint64_t>(out.count) * static_cast<std::uint64_t>(out.rows) *
                              static_cast<std::uint64_t>(out.cols);
  GS_CHECK_DATA(bytes <= kIdxMaxPixelBytes, path << ": " << out.count << " images of " << out.rows << "x"
                                                 << out.cols << " are " << bytes
                                                 << " bytes, over the limit of " << kIdxMaxPixelBytes);
  out.pixels = read_payload(src, bytes, "pixels");
  return out;
}

IdxLabels read_idx_labels(const std::string& path, int classes) {
  GS_CHECK_CONFIG(classes >= 1 && classes <= kIdxMaxClasses,
                  "number of classes " << classes << " is out of range: expected 1.." << kIdxMaxClasses);
  ByteSource src(path);
  const auto sizes = read_header(src, kIdxLabelsMagic, "labels");
  check_range(path, "label count", sizes[0], kIdxMaxItems);
  IdxLabels out;
  out.path = path;
  out.labels = read_payload(src, static_cast<std::uint64_t>(sizes[0]), "labels");
  for (std::size_t i = 0; i < out.labels.size(); ++i) {
    GS_CHECK_DATA(out.labels[i] < classes, path << ": label " << int{out.labels[i]} << " at index " << i
                                                << " is out of range: expected 0.." << classes - 1 << " ("
                                                << classes << " classes)");
  }
  return out;
}

IdxPair read_idx_pair(const std::string& images_path, const std::string& labels_path, int classes) {
  IdxPair pair{read_idx_images(images_path), read_idx_labels(labels_path, classes)};
  const auto labels = static_cast<std::int64_t>(pair.labels.labels.size());
  GS_CHECK_DATA(pair.images.count == labels, images_path << " has " << pair.images.count << " images but "
                                                         << labels_path << " has " << labels
                                                         << " labels: the counts must match");
  return pair;
}

}  // namespace gradscale
