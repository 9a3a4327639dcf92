// Checkpoint files (see checkpoint.h). Tensor file layout, little-endian:
//   "GSCKPT01" | u64 count | count × (u32 name_len, name, u32 rank, i64 dims[rank], f32 data[]) | u64 fnv1a
// where fnv1a covers every byte before it.
#include "lib/train/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/core/checksum.h"
#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'G', 'S', 'C', 'K', 'P', 'T', '0', '1'};
constexpr const char* kTensorPrefix = "tensors-";
constexpr const char* kTensorSuffix = ".bin";

std::uint64_t fnv1a(const char* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

void append(std::string& buf, const void* p, std::size_t n) {
  if (n > 0) buf.append(static_cast<const char*>(p), n);
}

template <class T>
void append_pod(std::string& buf, T v) {
  append(buf, &v, sizeof v);
}

// Reads the bytes of a tensor file in order; every read is bounds-checked.
class Reader {
 public:
  Reader(const std::string& data, std::string file) : data_(data), file_(std::move(file)) {}
  const char* take(std::size_t n) {
    GS_CHECK_DATA(n <= data_.size() - pos_, file_ << ": truncated checkpoint (needs " << pos_ << " + " << n
                                                  << " bytes, has " << data_.size() << ")");
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  template <class T>
  T pod() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }

 private:
  const std::string& data_;
  std::string file_;
  std::size_t pos_ = 0;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  GS_CHECK_DATA(in, p.string() << ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  GS_CHECK_DATA(in.good() || in.eof(), p.string() << ": read error");
  return ss.str();
}

// tensors-<tag>.bin with a tag of [A-Za-z0-9_]+: a plain name inside the checkpoint directory.
bool is_tensor_file_name(const std::string& name) {
  const std::size_t pre = std::strlen(kTensorPrefix), suf = std::strlen(kTensorSuffix);
  if (name.size() <= pre + suf || name.compare(0, pre, kTensorPrefix) != 0 ||
      name.compare(name.size() - suf, suf, kTensorSuffix) != 0)
    return false;
  for (std::size_t i = pre; i < name.size() - suf; ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'))
      return false;
  }
  return true;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string canonical_checksum(nlohmann::json meta) {
  meta.erase("checksum");
  const std::string text = meta.dump();
  return checksum_text(xxh64(text.data(), text.size()));
}

// The tensor file name the current checkpoint.json of `dir` names, or "" (none, or unreadable).
std::string current_tensor_file(const fs::path& json_path) {
  std::error_code ec;
  if (!fs::exists(json_path, ec)) return "";
  try {
    const nlohmann::json meta = read_json_file(json_path.string(), "checkpoint", JsonSource::data);
    const std::string name = meta.value("tensor_file", "");
    return is_tensor_file_name(name) ? name : "";
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

void seal_checkpoint_json(nlohmann::json& meta) {
  meta["checksum"] = canonical_checksum(meta);
}

void write_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& meta,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors) {
  const std::string tensor_file = kTensorPrefix + tag + kTensorSuffix;
  GS_CHECK(is_tensor_file_name(tensor_file), "checkpoint tag '" << tag << "' is not [A-Za-z0-9_]+");
  std::string bytes;
  append(bytes, kMagic, sizeof kMagic);
  append_pod<std::uint64_t>(bytes, tensors.size());
  for (const auto& [name, t] : tensors) {
    append_pod<std::uint32_t>(bytes, static_cast<std::uint32_t>(name.size()));
    append(bytes, name.data(), name.size());
    append_pod<std::uint32_t>(bytes, static_cast<std::uint32_t>(t->rank()));
    for (auto d : t->shape()) append_pod<std::int64_t>(bytes, d);
    append(bytes, t->data(), static_cast<std::size_t>(t->size()) * sizeof(float));
  }
  append_pod<std::uint64_t>(bytes, fnv1a(bytes.data(), bytes.size()));
  write_file_atomic((fs::path(dir) / tensor_file).string(), bytes);

  nlohmann::json m = meta;
  m["schema"] = kCheckpointSchema;
  m["tensor_file"] = tensor_file;
  m["tensor_bytes"] = bytes.size();
  m["tensor_checksum"] = checksum_text(xxh64(bytes.data(), bytes.size()));
  seal_checkpoint_json(m);
  const fs::path json_path = fs::path(dir) / kCheckpointJson;
  const std::string previous = current_tensor_file(json_path);
  write_file_atomic(json_path.string(), m.dump(1) + "\n");  // the commit point
  if (!previous.empty() && previous != tensor_file) {
    std::error_code ec;
    fs::remove(fs::path(dir) / previous, ec);
  }
}

nlohmann::json read_checkpoint_meta(const std::string& dir) {
  const fs::path json_path = fs::path(dir) / kCheckpointJson;
  const std::string file = json_path.string();
  std::error_code ec;
  GS_CHECK_DATA(fs::exists(json_path, ec), file << ": no checkpoint here");
  nlohmann::json meta = read_json_file(file, "checkpoint", JsonSource::data);
  const JsonFields f(meta, file);
  const std::string checksum = f.text("checksum");
  GS_CHECK_DATA(checksum == canonical_checksum(meta),
                file << ": checksum mismatch: the file was changed or damaged after it was written "
                        "(its content has checksum "
                     << canonical_checksum(meta) << ", the file says " << text_excerpt(checksum, 40) << ")");
  const std::string schema = f.text("schema");
  if (schema != kCheckpointSchema)
    f.fail("schema",
           "is '" + text_excerpt(schema, 40) + "', this gradscale reads '" + kCheckpointSchema + "'");
  const std::string tensor_file = f.text("tensor_file");
  if (!is_tensor_file_name(tensor_file))
    f.fail("tensor_file", "must name a file tensors-<tag>.bin in the checkpoint directory, got '" +
                              text_excerpt(tensor_file, 40) + "'");
  f.integer("tensor_bytes", 0, std::int64_t{1} << 62);
  f.text("tensor_checksum");
  return meta;
}

void read_checkpoint_tensors(const std::string& dir, const nlohmann::json& meta,
                             const std::vector<std::pair<std::string, Tensor*>>& tensors) {
  const fs::path path = fs::path(dir) / meta.at("tensor_file").get<std::string>();
  const std::string file = path.string();
  // The size the expected tensors take, computed before the file is opened.
  std::uint64_t expected = sizeof kMagic + 2 * sizeof(std::uint64_t);
  for (const auto& [name, t] : tensors)
    expected += 2 * sizeof(std::uint32_t) + name.size() + t->shape().size() * sizeof(std::int64_t) +
                static_cast<std::uint64_t>(t->size()) * sizeof(float);
  const std::uint64_t announced = meta.at("tensor_bytes").get<std::uint64_t>();
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  GS_CHECK_DATA(!ec, file << ": cannot read: " << ec.message());
  GS_CHECK_DATA(size == announced, file << ": " << size << " bytes, checkpoint.json says " << announced);
  GS_CHECK_DATA(size == expected, file << ": " << size << " bytes, but the model's " << tensors.size()
                                       << " tensors take " << expected
                                       << ": the checkpoint holds other tensors than this model has");

  const std::string data = read_all(path);
  GS_CHECK_DATA(data.size() == expected, file << ": changed size while being read");
  std::uint64_t stored;
  std::memcpy(&stored, data.data() + data.size() - sizeof stored, sizeof stored);
  GS_CHECK_DATA(stored == fnv1a(data.data(), data.size() - sizeof stored),
                file << ": checksum mismatch (corrupt checkpoint)");
  // The file is whole; is it the one this checkpoint.json was written with (and not the same-named
  // tensor file of another checkpoint)?
  const std::string content = checksum_text(xxh64(data.data(), data.size()));
  const std::string bound = meta.at("tensor_checksum").get<std::string>();
  GS_CHECK_DATA(content == bound, file << ": content checksum " << content << ", but " << kCheckpointJson
                                       << " says " << text_excerpt(bound, 40)
                                       << ": this tensor file belongs to another checkpoint");

  // The directory of names and shapes, checked against the model before any tensor is touched.
  Reader r(data, file);
  GS_CHECK_DATA(std::memcmp(r.take(sizeof kMagic), kMagic, sizeof kMagic) == 0,
                file << ": not a gradscale checkpoint");
  const auto count = r.pod<std::uint64_t>();
  GS_CHECK_DATA(count == tensors.size(),
                file << ": holds " << count << " tensors, the model expects " << tensors.size());
  std::vector<const char*> payload;
  for (const auto& [name, t] : tensors) {
    const auto len = r.pod<std::uint32_t>();
    const char* name_bytes = r.take(len);
    const std::string stored_name(name_bytes, len);
    const auto rank = r.pod<std::uint32_t>();
    Shape shape;
    for (std::uint32_t d = 0; d < rank && d <= t->shape().size(); ++d) shape.push_back(r.pod<std::int64_t>());
    GS_CHECK_DATA(stored_name == name && shape == t->shape(),
                  file << ": holds tensor '" << text_excerpt(stored_name, 80) << "' of shape "
                       << (rank == shape.size() ? shape_string(shape) : "of rank " + std::to_string(rank))
                       << " where the model expects '" << name << "' of shape " << shape_string(t->shape()));
    payload.push_back(r.take(static_cast<std::size_t>(t->size()) * sizeof(float)));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    Tensor& t = *tensors[i].second;
    if (t.size() > 0) std::memcpy(t.data(), payload[i], static_cast<std::size_t>(t.size()) * sizeof(float));
  }
}

bool is_checkpoint_file(const std::string& name) {
  return name == kCheckpointJson || is_tensor_file_name(name) ||
         (starts_with(name, kTensorPrefix) && name.find(".bin.tmp") != std::string::npos) ||
         starts_with(name, temp_name_prefix(kCheckpointJson));
}

int remove_orphaned_checkpoint_files(const std::string& dir, const std::string& keep) {
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool orphan = (is_tensor_file_name(name) && name != keep) ||
                        (starts_with(name, kTensorPrefix) && name.find(".bin.tmp") != std::string::npos) ||
                        starts_with(name, temp_name_prefix(kCheckpointJson));
    std::error_code remove_ec;
    if (orphan && it->is_regular_file(remove_ec) && fs::remove(it->path(), remove_ec)) ++removed;
  }
  return removed;
}

}  // namespace gradscale
