// Tests of lib/data's IDX reader and MNIST-format directories: generated, truncated and corrupt files
// (plain and gzip), errors naming the file and the problem, and the Fashion-MNIST fallback to synthetic
// data. Every file is written into a fresh temporary directory.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/skip.h"
#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/data/batcher.h"
#include "lib/data/dataset.h"
#include "lib/data/idx.h"
#include "lib/data/shuffle.h"
#include "lib/data/synthetic.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using namespace gradscale;
using gradscale::testing::TempDir;
using Bytes = std::vector<std::uint8_t>;
using Catch::Matchers::Contains;

namespace {

// Sets (or, with nullptr, unsets) an environment variable and puts the old value back at scope exit.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~EnvGuard() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

void put_u32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

// An IDX file: big-endian magic, big-endian dimension sizes, then the payload as given.
Bytes idx_file(std::uint32_t magic, const std::vector<std::uint32_t>& dims, const Bytes& payload) {
  Bytes out;
  put_u32(out, magic);
  for (auto d : dims) put_u32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Deterministic, non-constant, mostly non-zero bytes.
Bytes pattern_bytes(std::size_t n, int salt) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = static_cast<std::uint8_t>((i * 37 + static_cast<std::size_t>(salt)) % 251 + 1);
  return b;
}

Bytes label_bytes(std::size_t n, int classes) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = static_cast<std::uint8_t>((i * 7 + 3) % static_cast<std::size_t>(classes));
  return b;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void write_gz(const std::string& path, const Bytes& bytes, const char* mode = "wb") {
  gzFile f = gzopen(path.c_str(), mode);
  REQUIRE(f != nullptr);
  if (!bytes.empty())
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs `fn` and requires a DataError whose message names `file` and contains `problem`.
void require_data_error(const std::function<void()>& fn, const std::string& file,
                        const std::string& problem) {
  try {
    fn();
  } catch (const DataError& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK_THAT(msg, Contains(file));
    CHECK_THAT(msg, Contains(problem));
    return;
  }
  FAIL("expected a DataError naming " << file << " and saying '" << problem << "'");
}

constexpr std::uint32_t kCount = 5, kRows = 4, kCols = 3;  // non-square catches a rows/cols swap

Bytes good_images(std::uint32_t count = kCount, int salt = 0) {
  return idx_file(kIdxImagesMagic, {count, kRows, kCols}, pattern_bytes(count * kRows * kCols, salt));
}
Bytes good_labels(std::uint32_t count = kCount) {
  return idx_file(kIdxLabelsMagic, {count}, label_bytes(count, 10));
}

// The four files of an MNIST-format directory (6 train, 4 test examples of kRows x kCols).
void write_idx_dir(const TempDir& dir, bool gzip) {
  const auto write = [&](const std::string& name, const Bytes& b) {
    if (gzip) {
      write_gz(dir.file(name + ".gz"), b);
    } else {
      write_plain(dir.file(name), b);
    }
  };
  write("train-images-idx3-ubyte", good_images(6, 1));
  write("train-labels-idx1-ubyte", good_labels(6));
  write("t10k-images-idx3-ubyte", good_images(4, 2));
  write("t10k-labels-idx1-ubyte", good_labels(4));
}

void check_normalised(const Dataset& d, const Bytes& pixels, Normalization norm) {
  REQUIRE(d.images.size() == static_cast<std::int64_t>(pixels.size()));
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    const double want = (pixels[i] / 255.0 - norm.mean) / norm.std;
    REQUIRE(d.images[static_cast<std::int64_t>(i)] == Approx(want).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("IDX images and labels read back exactly, plain and gzip", "[data]") {
  TempDir dir;
  const Bytes pixels = pattern_bytes(kCount * kRows * kCols, 0);
  const Bytes images = good_images();
  const Bytes labels = good_labels();
  write_plain(dir.file("img"), images);
  write_gz(dir.file("img.gz"), images);
  write_plain(dir.file("lab"), labels);
  write_gz(dir.file("lab.gz"), labels);
  // Two concatenated gzip members are one valid gzip file (gzip -c a b > c).
  const Bytes first(images.begin(), images.begin() + 23), second(images.begin() + 23, images.end());
  write_gz(dir.file("img2.gz"), first);
  write_gz(dir.file("img2.gz"), second, "ab");

  for (const char* name : {"img", "img.gz", "img2.gz"}) {
    INFO(name);
    const IdxImages im = read_idx_images(dir.file(name));
    CHECK(im.path == dir.file(name));
    CHECK(im.count == kCount);
    CHECK(im.rows == kRows);
    CHECK(im.cols == kCols);
    CHECK(im.pixels == pixels);
  }
  for (const char* name : {"lab", "lab.gz"}) {
    const IdxLabels lb = read_idx_labels(dir.file(name), 10);
    CHECK(lb.labels == label_bytes(kCount, 10));
  }
  const IdxPair pair = read_idx_pair(dir.file("img.gz"), dir.file("lab"), 10);
  CHECK(pair.images.pixels == pixels);
  CHECK(pair.labels.labels.size() == kCount);
}

TEST_CASE("mnist:DIR loads plain, gzip and mixed directories into normalised tensors", "[data]") {
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    TempDir dir;
    write_idx_dir(dir, variant == 1);
    if (variant == 2) {  // mixed: test files gzip; a corrupt .gz beside a plain file is ignored (plain wins)
      write_plain(dir.file("train-images-idx3-ubyte.gz"), {1, 2, 3});
      write_gz(dir.file("t10k-images-idx3-ubyte.gz"), good_images(4, 2));
      fs::remove(dir.file("t10k-images-idx3-ubyte"));
    }
    const DataSplit split = load_data("mnist:" + dir.str(), 0);
    CHECK(split.train.images.shape() == Shape{6, 1, kRows, kCols});
    CHECK(split.test.images.shape() == Shape{4, 1, kRows, kCols});
    CHECK(split.train.classes == 10);
    CHECK(split.train.name == "mnist/train");
    CHECK(split.test.name == "mnist/test");
    check_normalised(split.train, pattern_bytes(6 * kRows * kCols, 1), kMnistNormalization);
    check_normalised(split.test, pattern_bytes(4 * kRows * kCols, 2), kMnistNormalization);
    const Bytes want = label_bytes(6, 10);
    CHECK(split.train.labels == std::vector<std::int32_t>(want.begin(), want.end()));
    CHECK_THAT(split.source, Contains(dir.str()));
    CHECK_THAT(split.source, Contains("0.1307"));
  }
}

TEST_CASE("corrupt IDX files give a DataError naming the file and the problem", "[data]") {
  TempDir dir;
  const Bytes images = good_images();
  const std::string path = dir.file("images-idx3-ubyte");
  const auto images_fail = [&](const std::string& problem) {
    require_data_error([&] { read_idx_images(path); }, path, problem);
  };

  SECTION("truncated pixels, plain and gzip") {
    const Bytes cut(images.begin(), images.end() - 3);
    write_plain(path, cut);
    images_fail("truncated: expected 60 bytes of pixels, got 57");
    write_gz(path, cut);
    images_fail("truncated: expected 60 bytes of pixels, got 57");
  }
  SECTION("gzip stream cut short") {
    write_gz(path, images);
    const Bytes gz = read_raw(path);
    write_plain(path, Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
    images_fail("truncated");
    // All pixels present but the 8-byte CRC/size trailer missing.
    write_plain(path, Bytes(gz.begin(), gz.end() - 8));
    images_fail("truncated gzip stream");
  }
  SECTION("corrupt gzip: wrong CRC") {
    write_gz(path, images);
    Bytes gz = read_raw(path);
    gz[gz.size() - 8] ^= 0xFF;
    write_plain(path, gz);
    images_fail("corrupt gzip data");
  }
  SECTION("truncated header and empty file") {
    write_plain(path, Bytes(images.begin(), images.begin() + 10));
    images_fail("truncated: expected a 16-byte header, got 10 bytes");
    write_plain(path, {});
    images_fail("truncated: expected a 4-byte magic number, got 0 bytes");
  }
  SECTION("trailing data: plain, inside gzip, after the gzip stream") {
    Bytes longer = images;
    longer.insert(longer.end(), {9, 9, 9});
    write_plain(path, longer);
    images_fail("trailing data: 3 bytes after the 60 bytes of pixels");
    write_gz(path, longer);
    images_fail("trailing data: 3 bytes after the 60 bytes of pixels");
    write_gz(path, images);
    Bytes gz = read_raw(path);
    gz.insert(gz.end(), {'j', 'u', 'n', 'k', '!'});
    write_plain(path, gz);
    images_fail("trailing data: 5 bytes after the end of the gzip stream");
  }
  SECTION("bad magic, element type and number of dimensions") {
    Bytes b = images;
    b[0] = 0x12, b[1] = 0x34, b[2] = 0x56, b[3] = 0x78;
    write_plain(path, b);
    images_fail("bad magic number 0x12345678");
    write_plain(path, idx_file(0x00000D03, {kCount, kRows, kCols}, pattern_bytes(60, 0)));
    images_fail("unsupported element type 0x0000000D");
    write_plain(path, idx_file(0x00000802, {kCount, kRows * kCols}, pattern_bytes(60, 0)));
    images_fail("wrong number of dimensions: 2");
    // A label file handed to the image reader and vice versa.
    write_plain(path, good_labels());
    images_fail("wrong number of dimensions: 1");
    write_plain(path, images);
    require_data_error([&] { read_idx_labels(path, 10); }, path, "wrong number of dimensions: 3");
  }
  SECTION("dimension sizes outside the sane limits") {
    write_plain(path, idx_file(kIdxImagesMagic, {kCount, 0, kCols}, {}));
    images_fail("rows 0 in the header is out of range");
    write_plain(path, idx_file(kIdxImagesMagic, {kCount, kRows, 5000}, {}));
    images_fail("columns 5000 in the header is out of range");
    write_plain(path, idx_file(kIdxImagesMagic, {0, kRows, kCols}, {}));
    images_fail("image count 0 in the header is out of range");
    write_plain(path, idx_file(kIdxImagesMagic, {0xFFFFFFFFu, kRows, kCols}, {}));
    images_fail("image count 4294967295 in the header is out of range");
    write_plain(path, idx_file(kIdxImagesMagic, {100'000'000, 28, 28}, {}));
    images_fail("over the limit");
  }
  SECTION("label out of range") {
    Bytes labels = good_labels();
    labels[8 + 3] = 10;
    write_plain(path, labels);
    require_data_error([&] { read_idx_labels(path, 10); }, path, "label 10 at index 3 is out of range");
    CHECK_NOTHROW(read_idx_labels(path, 11));
    CHECK_THROWS_AS(read_idx_labels(path, 0), ConfigError);
  }
  SECTION("images and labels disagree in count") {
    const std::string labels = dir.file("labels-idx1-ubyte");
    write_plain(path, images);
    write_plain(labels, good_labels(kCount - 1));
    require_data_error([&] { read_idx_pair(path, labels, 10); }, labels, "has 5 images but");
    require_data_error([&] { read_idx_pair(path, labels, 10); }, path, "the counts must match");
  }
  SECTION("missing file") {
    images_fail("cannot open");
  }
}

TEST_CASE("MNIST-format directories with missing or mismatched files are DataErrors", "[data]") {
  TempDir dir;
  write_idx_dir(dir, false);
  SECTION("missing test labels") {
    fs::remove(dir.file("t10k-labels-idx1-ubyte"));
    require_data_error([&] { load_data("mnist:" + dir.str(), 0); }, dir.str(),
                       "missing t10k-labels-idx1-ubyte");
  }
  SECTION("a bad file inside is reported with its own path") {
    write_plain(dir.file("t10k-labels-idx1-ubyte"), good_labels(3));
    require_data_error([&] { load_data("mnist:" + dir.str(), 0); }, dir.file("t10k-labels-idx1-ubyte"),
                       "the counts must match");
  }
  SECTION("train and test image sizes differ") {
    write_plain(dir.file("t10k-images-idx3-ubyte"),
                idx_file(kIdxImagesMagic, {4, kCols, kRows}, pattern_bytes(48, 0)));
    require_data_error([&] { load_data("mnist:" + dir.str(), 0); }, dir.file("t10k-images-idx3-ubyte"),
                       "train and test must have the same size");
  }
  SECTION("a directory that does not exist") {
    require_data_error([&] { load_data("mnist:" + dir.file("nope"), 0); }, dir.file("nope"), "missing");
  }
}

TEST_CASE("fashion-mnist falls back to synthetic only when its files are absent", "[data]") {
  TempDir dir;
  EnvGuard env(kFashionMnistDirEnv, dir.str().c_str());
  SECTION("absent: synthetic, and the source says so") {
    const DataSplit split = load_data("fashion-mnist", 5);
    CHECK(split.train.size() == kSyntheticTrainSize);
    CHECK(split.test.size() == kSyntheticTestSize);
    CHECK(split.train.name == "synthetic/train");
    CHECK_THAT(split.source, Contains("FALLBACK") && Contains(dir.str()) && Contains(kFashionMnistDirEnv));
    const DataSplit same = load_data("synthetic", 5);
    CHECK(split.train.labels == same.train.labels);
  }
  SECTION("present: loaded from the directory with the Fashion-MNIST normalisation") {
    write_idx_dir(dir, true);
    const DataSplit split = load_data("fashion-mnist", 5);
    CHECK(split.train.size() == 6);
    CHECK(split.train.name == "fashion-mnist/train");
    check_normalised(split.test, pattern_bytes(4 * kRows * kCols, 2), kFashionMnistNormalization);
    CHECK_THAT(split.source, Contains("fashion-mnist from " + dir.str()) && Contains("0.2860"));
  }
  SECTION("partly present: an error, not a silent fallback") {
    write_idx_dir(dir, true);
    fs::remove(dir.file("t10k-images-idx3-ubyte.gz"));
    require_data_error([&] { load_data("fashion-mnist", 5); }, dir.str(), "missing t10k-images-idx3-ubyte");
  }
}

TEST_CASE("the installed Fashion-MNIST has 60000/10000 images of 28x28 with labels 0..9", "[data]") {
  const char* env = std::getenv(kFashionMnistDirEnv);
  const std::string dir = env && *env ? env : kFashionMnistDefaultDir;
  bool all = true;
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"}) {
    all = all && (fs::exists(fs::path(dir) / f) || fs::exists(fs::path(dir) / (std::string(f) + ".gz")));
  }
  if (!all) gradscale::test::skip_test("Fashion-MNIST files not found in " + dir + " (install dataset-fashion-mnist)");
  const DataSplit split = load_data("fashion-mnist", 0);
  CHECK_THAT(split.source, Contains("fashion-mnist from"));
  REQUIRE(split.train.images.shape() == Shape{60000, 1, 28, 28});
  REQUIRE(split.test.images.shape() == Shape{10000, 1, 28, 28});
  // The dataset is balanced: 6000 train and 1000 test images per class.
  for (const Dataset* d : {&split.train, &split.test}) {
    std::vector<int> per_class(10, 0);
    for (auto l : d->labels) {
      REQUIRE(l >= 0);
      REQUIRE(l < 10);
      ++per_class[static_cast<std::size_t>(l)];
    }
    CHECK(per_class == std::vector<int>(10, static_cast<int>(d->size() / 10)));
  }
  // The documented constants are the train set's own statistics.
  const auto flat = split.train.images.rows_view().cast<double>();
  const double mean = flat.mean();
  CHECK(std::abs(mean) < 0.001);
  CHECK(std::sqrt((flat.array() - mean).square().mean()) == Approx(1.0).margin(0.001));
}
