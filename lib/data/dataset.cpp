// Normalisation, IDX directories and the data-spec dispatcher (see dataset.h and docs/data.md).
#include "lib/data/dataset.h"

#include <array>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iomanip>
#include <sstream>

#include "lib/core/checksum.h"
#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/data/synthetic.h"

namespace gradscale {
namespace {

constexpr const char* kSpecForms =
    "fashion-mnist, mnist:DIR (a directory of MNIST-format IDX files), synthetic, synthetic:N (N training "
    "examples, 1..10000000)";

// The four files of an MNIST-format directory, train images first.
constexpr std::array<const char*, 4> kIdxFiles = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// `dir/base` when it is a file, else `dir/base.gz` when that is, else "".
std::string find_idx_file(const std::string& dir, const std::string& base) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path plain = fs::path(dir) / base;
  if (fs::is_regular_file(plain, ec)) return plain.string();
  const fs::path gz = fs::path(dir) / (base + ".gz");
  if (fs::is_regular_file(gz, ec)) return gz.string();
  return "";
}

std::string describe(const DataSplit& split, const std::string& what, Normalization norm) {
  const Shape& s = split.train.images.shape();
  std::ostringstream os;
  os << what << ": " << split.train.size() << " train / " << split.test.size() << " test images of " << s[1]
     << "x" << s[2] << "x" << s[3] << ", " << split.train.classes << " classes, normalised (x/255 - "
     << std::fixed << std::setprecision(4) << norm.mean << ") / " << norm.std;
  return os.str();
}

std::int64_t parse_synthetic_size(const std::string& spec, const std::string& text) {
  bool digits = !text.empty() && text.size() <= 9;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  const std::int64_t n = digits ? std::stoll(text) : 0;
  GS_CHECK_CONFIG(n >= 1 && n <= kSyntheticMaxSize,
                  "data spec '" << text_excerpt(spec) << "': N must be an integer in 1.." << kSyntheticMaxSize
                                << " (allowed forms: " << kSpecForms << ")");
  return n;
}

}  // namespace

Tensor normalized_images(const std::vector<std::uint8_t>& pixels, const Shape& shape, Normalization norm) {
  GS_CHECK_SHAPE(shape_size(shape) == static_cast<std::int64_t>(pixels.size()),
                 pixels.size() << " pixels do not fill shape " << shape_string(shape));
  GS_CHECK_CONFIG(norm.std > 0.0f, "normalisation std must be positive, got " << norm.std);
  std::array<float, 256> table;
  for (int v = 0; v < 256; ++v) {
    table[static_cast<std::size_t>(v)] =
        static_cast<float>((v / 255.0 - double{norm.mean}) / double{norm.std});
  }
  Tensor out;
  out.resize(shape);
  float* dst = out.data();
  const std::uint8_t* src = pixels.data();
  const auto n = static_cast<std::int64_t>(pixels.size());
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
  return out;
}

Dataset dataset_from_idx(const IdxPair& pair, int classes, Normalization norm, std::string name) {
  const IdxImages& im = pair.images;
  Dataset d;
  d.images = normalized_images(im.pixels, {im.count, 1, im.rows, im.cols}, norm);
  d.labels.assign(pair.labels.labels.begin(), pair.labels.labels.end());
  d.classes = classes;
  d.name = std::move(name);
  return d;
}

DataSplit load_idx_dir(const std::string& dir, Normalization norm, const std::string& name) {
  std::array<std::string, 4> paths;
  for (std::size_t i = 0; i < kIdxFiles.size(); ++i) {
    paths[i] = find_idx_file(dir, kIdxFiles[i]);
    GS_CHECK_DATA(!paths[i].empty(), dir << ": missing " << kIdxFiles[i] << " (or " << kIdxFiles[i]
                                         << ".gz); a " << name << " directory needs " << kIdxFiles[0] << ", "
                                         << kIdxFiles[1] << ", " << kIdxFiles[2] << " and " << kIdxFiles[3]
                                         << ", each plain or gzip");
  }
  DataSplit split;
  // The test split loads on a second thread while the train split inflates (gzip cannot be split).
  auto test = std::async(std::launch::async, [&] {
    return dataset_from_idx(read_idx_pair(paths[2], paths[3], kIdxClasses), kIdxClasses, norm,
                            name + "/test");
  });
  try {
    split.train =
        dataset_from_idx(read_idx_pair(paths[0], paths[1], kIdxClasses), kIdxClasses, norm, name + "/train");
  } catch (...) {
    test.wait();  // it references paths and norm; let it finish before they go
    throw;
  }
  split.test = test.get();
  const Shape& a = split.train.images.shape();
  const Shape& b = split.test.images.shape();
  GS_CHECK_DATA(a[2] == b[2] && a[3] == b[3], paths[2] << ": test images are " << b[2] << "x" << b[3]
                                                       << " but " << paths[0] << " has " << a[2] << "x"
                                                       << a[3] << ": train and test must have the same size");
  split.source = describe(split, name + " from " + dir, norm);
  return split;
}

namespace {

// The split a spec names (load_data without the checksum).
DataSplit load_split(const std::string& spec, std::uint64_t seed) {
  if (spec == "fashion-mnist") {
    const char* env = std::getenv(kFashionMnistDirEnv);
    const bool from_env = env != nullptr && *env != '\0';
    const std::string dir = from_env ? env : kFashionMnistDefaultDir;
    int present = 0;
    for (const char* f : kIdxFiles) present += find_idx_file(dir, f).empty() ? 0 : 1;
    if (present > 0) return load_idx_dir(dir, kFashionMnistNormalization, "fashion-mnist");
    // Absent altogether: fall back, loudly (the source line is printed by the CLI and kept in results).
    DataSplit split = make_synthetic(kSyntheticTrainSize, kSyntheticTestSize, seed);
    split.source =
        "FALLBACK to synthetic data: Fashion-MNIST files not found in " + dir +
        (from_env ? std::string(" (from $") + kFashionMnistDirEnv + ")"
                  : std::string(" (install dataset-fashion-mnist or set $") + kFashionMnistDirEnv + ")") +
        "; using " + split.source;
    return split;
  }
  const std::string mnist = "mnist:";
  if (spec.compare(0, mnist.size(), mnist) == 0) {
    const std::string dir = spec.substr(mnist.size());
    GS_CHECK_CONFIG(
        !dir.empty(),
        "data spec 'mnist:' needs a directory, e.g. mnist:/data/mnist (allowed forms: " << kSpecForms << ")");
    return load_idx_dir(dir, kMnistNormalization, "mnist");
  }
  if (spec == "synthetic") return make_synthetic(kSyntheticTrainSize, kSyntheticTestSize, seed);
  const std::string synthetic = "synthetic:";
  if (spec.compare(0, synthetic.size(), synthetic) == 0) {
    const std::int64_t n = parse_synthetic_size(spec, spec.substr(synthetic.size()));
    return make_synthetic(n, (n + 3) / 4, seed);
  }
  throw ConfigError("unknown data spec '" + text_excerpt(spec) + "': allowed forms are " + kSpecForms);
}

}  // namespace

std::string data_checksum(const DataSplit& split) {
  std::uint64_t h = 0;
  for (const Dataset* d : {&split.train, &split.test}) {
    const Shape& shape = d->images.shape();
    h = xxh64(shape.data(), shape.size() * sizeof(std::int64_t), h);
    h = xxh64(d->images.data(), static_cast<std::size_t>(d->images.size()) * sizeof(float), h);
    h = xxh64(d->labels.data(), d->labels.size() * sizeof(std::int32_t), h);
  }
  return checksum_text(h);
}

DataSplit load_data(const std::string& spec, std::uint64_t seed) {
  DataSplit split = load_split(spec, seed);
  split.checksum = data_checksum(split);
  return split;
}

}  // namespace gradscale
