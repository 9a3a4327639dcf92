// Checkpoint files (see checkpoint.h). Tensor file layout, little-endian:
//   "GSCKPT01" | u64 count | count × (u32 name_len, name, u32 rank, i64 dims[rank], f32 data[]) | u64 fnv1a
#include "lib/train/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/core/error.h"

namespace gradscale {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'G', 'S', 'C', 'K', 'P', 'T', '0', '1'};

struct Fnv1a {
  std::uint64_t h = 1469598103934665603ull;
  void add(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
};

class Writer {
 public:
  void raw(const void* p, std::size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    sum_.add(p, n);
  }
  template <class T>
  void pod(T v) {
    raw(&v, sizeof v);
  }
  std::string finish() {
    const std::uint64_t h = sum_.h;
    buf_.append(reinterpret_cast<const char*>(&h), sizeof h);
    return std::move(buf_);
  }

 private:
  std::string buf_;
  Fnv1a sum_;
};

class Reader {
 public:
  Reader(const std::string& data, std::string file) : data_(data), file_(std::move(file)) {}
  void raw(void* p, std::size_t n) {
    GS_CHECK_DATA(pos_ + n <= data_.size(), file_ << ": truncated checkpoint (needs " << pos_ + n
                                                  << " bytes, has " << data_.size() << ")");
    std::memcpy(p, data_.data() + pos_, n);
    sum_.add(p, n);
    pos_ += n;
  }
  template <class T>
  T pod() {
    T v;
    raw(&v, sizeof v);
    return v;
  }
  void check_end() {
    const std::uint64_t expect = sum_.h;
    std::uint64_t stored;
    GS_CHECK_DATA(pos_ + sizeof stored == data_.size(),
                  file_ << ": unexpected size " << data_.size() << " bytes");
    std::memcpy(&stored, data_.data() + pos_, sizeof stored);
    GS_CHECK_DATA(stored == expect, file_ << ": checksum mismatch (corrupt checkpoint)");
  }

 private:
  const std::string& data_;
  std::string file_;
  std::size_t pos_ = 0;
  Fnv1a sum_;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  GS_CHECK_DATA(in, p.string() << ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void write_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& meta,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors) {
  fs::create_directories(dir);
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.pod<std::uint64_t>(tensors.size());
  for (const auto& [name, t] : tensors) {
    w.pod<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
    w.raw(name.data(), name.size());
    w.pod<std::uint32_t>(static_cast<std::uint32_t>(t->rank()));
    for (auto d : t->shape()) w.pod<std::int64_t>(d);
    w.raw(t->data(), static_cast<std::size_t>(t->size()) * sizeof(float));
  }
  const std::string tensor_file = "tensors-" + tag + ".bin";
  const std::string bytes = w.finish();
  write_file_atomic((fs::path(dir) / tensor_file).string(), bytes);

  nlohmann::json m = meta;
  m["tensor_file"] = tensor_file;
  m["tensor_bytes"] = bytes.size();
  const fs::path json_path = fs::path(dir) / "checkpoint.json";
  std::string previous;
  if (fs::exists(json_path)) {
    try {
      previous = nlohmann::json::parse(read_all(json_path)).value("tensor_file", "");
    } catch (const std::exception&) {
      previous.clear();
    }
  }
  write_file_atomic(json_path.string(), m.dump(1) + "\n");  // the commit point
  if (!previous.empty() && previous != tensor_file) fs::remove(fs::path(dir) / previous);
}

Checkpoint read_checkpoint(const std::string& dir) {
  const fs::path json_path = fs::path(dir) / "checkpoint.json";
  GS_CHECK_DATA(fs::exists(json_path), json_path.string() << ": no checkpoint here");
  Checkpoint c;
  try {
    c.meta = nlohmann::json::parse(read_all(json_path));
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(json_path.string() + ": not valid JSON: " + e.what());
  }
  GS_CHECK_DATA(c.meta.contains("tensor_file") && c.meta["tensor_file"].is_string(),
                json_path.string() << ": names no tensor file");
  const fs::path tensor_path = fs::path(dir) / c.meta["tensor_file"].get<std::string>();
  const std::string data = read_all(tensor_path);
  GS_CHECK_DATA(data.size() == c.meta.value("tensor_bytes", std::uint64_t{0}),
                tensor_path.string() << ": " << data.size() << " bytes, the checkpoint expects "
                                     << c.meta.value("tensor_bytes", std::uint64_t{0}));
  Reader r(data, tensor_path.string());
  char magic[8];
  r.raw(magic, sizeof magic);
  GS_CHECK_DATA(std::memcmp(magic, kMagic, sizeof kMagic) == 0, tensor_path.string()
                                                                    << ": not a gradscale checkpoint");
  const auto count = r.pod<std::uint64_t>();
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto len = r.pod<std::uint32_t>();
    GS_CHECK_DATA(len < 4096, tensor_path.string() << ": corrupt tensor name length " << len);
    std::string name(len, '\0');
    r.raw(name.data(), len);
    const auto rank = r.pod<std::uint32_t>();
    GS_CHECK_DATA(rank <= 8, tensor_path.string() << ": corrupt rank " << rank << " of '" << name << "'");
    Shape shape(rank);
    for (auto& d : shape) {
      d = r.pod<std::int64_t>();
      GS_CHECK_DATA(d >= 0 && d < (std::int64_t{1} << 34), tensor_path.string()
                                                               << ": corrupt shape of '" << name << "'");
    }
    Tensor t(shape);
    r.raw(t.data(), static_cast<std::size_t>(t.size()) * sizeof(float));
    c.tensors.emplace(name, std::move(t));
  }
  r.check_end();
  return c;
}

}  // namespace gradscale
