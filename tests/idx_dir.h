// Test helper: a tiny MNIST-format directory (IDX files), for tests that train on data read from files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace gradscale::test {

// `n` train and `n` test images of 28x28 (pixel = (i * 7 + j) % 256), labels i % 10, in `dir` (created).
inline void write_idx_dir(const std::filesystem::path& dir, int n) {
  std::filesystem::create_directories(dir);
  auto be32 = [](std::string& s, std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((v >> shift) & 0xFF);
  };
  for (const char* split : {"train", "t10k"}) {
    std::string images, labels;
    be32(images, 0x803);
    be32(images, static_cast<std::uint32_t>(n));
    be32(images, 28);
    be32(images, 28);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < 28 * 28; ++j) images += static_cast<char>((i * 7 + j) % 256);
    be32(labels, 0x801);
    be32(labels, static_cast<std::uint32_t>(n));
    for (int i = 0; i < n; ++i) labels += static_cast<char>(i % 10);
    std::ofstream(dir / (std::string(split) + "-images-idx3-ubyte"), std::ios::binary) << images;
    std::ofstream(dir / (std::string(split) + "-labels-idx1-ubyte"), std::ios::binary) << labels;
  }
}

}  // namespace gradscale::test
