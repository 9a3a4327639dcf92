// Datasets as the training loop sees them: normalised float images [N, C, H, W] with int labels, and
// `load_data`, which turns a data spec (fashion-mnist, mnist:DIR, synthetic[:N]) into a train/test split.
// See docs/data.md for the specs, the normalisation constants and the fallback rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/data/idx.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

// Per-dataset pixel normalisation: x = (p / 255 - mean) / std for a byte p.
struct Normalization {
  float mean = 0.0f;
  float std = 1.0f;
};
// Mean and standard deviation of p / 255 over the training images (the values PyTorch users use).
inline constexpr Normalization kFashionMnistNormalization{0.2860f, 0.3530f};
inline constexpr Normalization kMnistNormalization{0.1307f, 0.3081f};

// Where `fashion-mnist` looks: the directory in this environment variable, else the Debian package's.
inline constexpr const char* kFashionMnistDirEnv = "GRADSCALE_FASHION_MNIST_DIR";
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kIdxClasses = 10;  // MNIST and Fashion-MNIST

// One split of a dataset; owns everything. images.dim(0) == labels.size(), every label in [0, classes).
struct Dataset {
  Tensor images;  // [N, C, H, W] float32, normalised
  std::vector<std::int32_t> labels;
  int classes = 0;
  std::string name;  // e.g. "fashion-mnist/train"
  std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
};

struct DataSplit {
  Dataset train;
  Dataset test;
  std::string source;    // human-readable: which data was used, from where (and why, for the fallback)
  std::string checksum;  // data_checksum() of the split, set by load_data: identifies the data by content
};

// The content of a split as one checksum ("xxh64:<hex>"): the shapes, normalised images and labels of
// train then test. The same files, plain or gzipped, wherever they lie, give the same checksum; one
// changed pixel or label changes it. Takes about 20 ms for Fashion-MNIST.
std::string data_checksum(const DataSplit& split);

// Bytes [count * channels * rows * cols] to a normalised float tensor [count, channels, rows, cols].
// Exact and deterministic: every byte value maps through one table computed in double.
Tensor normalized_images(const std::vector<std::uint8_t>& pixels, const Shape& shape, Normalization norm);

// A Dataset (C = 1) from an IDX pair (images and labels already checked to agree).
Dataset dataset_from_idx(const IdxPair& pair, int classes, Normalization norm, std::string name);

// The MNIST-format files in `dir`: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte, each plain or with ".gz" (the plain file wins when both exist). Train and test
// must have the same image size. Throws DataError naming the missing or bad file.
DataSplit load_idx_dir(const std::string& dir, Normalization norm, const std::string& name);

// Loads the data named by `spec`:
//   "fashion-mnist"  Fashion-MNIST from $GRADSCALE_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist;
//                    when none of its four files is there, the default synthetic split instead, and
//                    `source` says so (some but not all files present: DataError).
//   "mnist:DIR"      MNIST-format files in DIR (MNIST normalisation); missing files: DataError.
//   "synthetic"      4096 train / 1024 test synthetic examples (synthetic.h), from `seed`.
//   "synthetic:N"    N train / ceil(N / 4) test synthetic examples, 1 <= N <= 10,000,000.
// `seed` only affects synthetic data. Any other spec: ConfigError listing these forms. The result's
// `checksum` is filled in.
DataSplit load_data(const std::string& spec, std::uint64_t seed);

}  // namespace gradscale
