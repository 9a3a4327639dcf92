// A strict reader of IDX files, the container of MNIST and Fashion-MNIST: unsigned-byte images (IDX3)
// and labels (IDX1), gzip-compressed or plain. Every problem -- missing file, bad magic number, wrong
// number of dimensions, insane sizes, truncation, trailing data, corrupt gzip, label out of range -- is
// a gradscale::DataError whose message starts with the file's path and says what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradscale {

// Magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;
// Sanity limits on a header, checked before anything is allocated.
inline constexpr std::int64_t kIdxMaxItems = 100'000'000;       // images or labels in one file
inline constexpr std::int64_t kIdxMaxSide = 1024;               // rows and columns of an image
inline constexpr std::uint64_t kIdxMaxPixelBytes = 1ull << 32;  // count * rows * cols
inline constexpr int kIdxMaxClasses = 256;                      // labels are single bytes

// The images of an IDX3 unsigned-byte file: `count` images of rows x cols pixels, row-major, one byte
// each, in file order. Owns its pixels.
struct IdxImages {
  std::string path;
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols bytes
};

// The labels of an IDX1 unsigned-byte file, in file order; each is < the `classes` they were read with.
struct IdxLabels {
  std::string path;
  std::vector<std::uint8_t> labels;
};

// Reads `path`: gzip when it starts with the gzip magic bytes (concatenated gzip members are allowed),
// the raw bytes otherwise. Requires 1 <= count <= kIdxMaxItems, 1 <= rows, cols <= kIdxMaxSide,
// count * rows * cols <= kIdxMaxPixelBytes, and exactly the announced number of payload bytes (fewer:
// "truncated", more: "trailing data"). Throws DataError.
IdxImages read_idx_images(const std::string& path);

// Reads an IDX1 label file like read_idx_images; also requires every label < classes,
// with 1 <= classes <= kIdxMaxClasses (else ConfigError).
IdxLabels read_idx_labels(const std::string& path, int classes);

// Images and labels of one split, checked to agree in count (DataError naming both files otherwise).
struct IdxPair {
  IdxImages images;
  IdxLabels labels;
};
IdxPair read_idx_pair(const std::string& images_path, const std::string& labels_path, int classes);

}  // namespace gradscale
