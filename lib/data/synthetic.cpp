// The synthetic dataset (see synthetic.h): per-class prototypes of bright rectangles, and samples that
// are shifted, dimmed, noisy copies. Integer arithmetic and mt19937_64 only, so bytes match everywhere.
#include "lib/data/synthetic.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iomanip>
#include <random>
#include <sstream>

#include "lib/core/error.h"
#include "lib/data/shuffle.h"

namespace gradscale {
namespace {

constexpr int kPixels = kSyntheticSide * kSyntheticSide;
constexpr int kRectsPerClass = 3;
constexpr int kMaxShift = 3;  // samples move by up to this many pixels in x and y
constexpr int kNoise = 100;   // uniform byte noise in [-kNoise, kNoise]
constexpr int kMinGain = 96;  // brightness gain in [kMinGain, 256] / 256

using Prototype = std::array<std::uint8_t, kPixels>;

int draw(std::mt19937_64& rng, int bound) {
  return static_cast<int>(draw_below(rng, static_cast<std::uint64_t>(bound)));
}

std::array<Prototype, kSyntheticClasses> make_prototypes(std::mt19937_64& rng) {
  std::array<Prototype, kSyntheticClasses> protos{};
  for (Prototype& p : protos) {
    for (int r = 0; r < kRectsPerClass; ++r) {
      const int w = 3 + draw(rng, 10);
      const int h = 3 + draw(rng, 10);
      const int x0 = 2 + draw(rng, kSyntheticSide - 4 - w + 1);  // inside a 2-pixel border
      const int y0 = 2 + draw(rng, kSyntheticSide - 4 - h + 1);
      const auto value = static_cast<std::uint8_t>(128 + draw(rng, 128));
      for (int y = y0; y < y0 + h; ++y) {
        for (int x = x0; x < x0 + w; ++x) {
          std::uint8_t& px = p[static_cast<std::size_t>(y * kSyntheticSide + x)];
          px = std::max(px, value);
        }
      }
    }
  }
  return protos;
}

// n samples: bytes [n, 1, 28, 28] and labels, from the prototypes and a generator of their own.
void make_samples(const std::array<Prototype, kSyntheticClasses>& protos, std::mt19937_64& rng,
                  std::int64_t n, std::vector<std::uint8_t>& pixels, std::vector<std::int32_t>& labels) {
  pixels.resize(static_cast<std::size_t>(n) * kPixels);
  labels.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const int label = draw(rng, kSyntheticClasses);
    const int dx = draw(rng, 2 * kMaxShift + 1) - kMaxShift;
    const int dy = draw(rng, 2 * kMaxShift + 1) - kMaxShift;
    const int gain = kMinGain + draw(rng, 256 - kMinGain + 1);
    const Prototype& p = protos[static_cast<std::size_t>(label)];
    std::uint8_t* out = pixels.data() + i * kPixels;
    for (int y = 0; y < kSyntheticSide; ++y) {
      for (int x = 0; x < kSyntheticSide; ++x) {
        const int sy = y - dy;
        const int sx = x - dx;
        const bool inside = sy >= 0 && sy < kSyntheticSide && sx >= 0 && sx < kSyntheticSide;
        const int base = inside ? p[static_cast<std::size_t>(sy * kSyntheticSide + sx)] : 0;
        const int v = base * gain / 256 + draw(rng, 2 * kNoise + 1) - kNoise;
        out[y * kSyntheticSide + x] = static_cast<std::uint8_t>(std::clamp(v, 0, 255));
      }
    }
    labels[static_cast<std::size_t>(i)] = label;
  }
}

// Mean and std of p / 255 over the bytes, from their histogram (exact counts, a fixed summation order).
Normalization byte_statistics(const std::vector<std::uint8_t>& pixels) {
  std::array<std::uint64_t, 256> counts{};
  for (std::uint8_t v : pixels) ++counts[v];
  const auto n = static_cast<double>(pixels.size());
  double mean = 0.0;
  for (int v = 0; v < 256; ++v)
    mean += static_cast<double>(counts[static_cast<std::size_t>(v)]) * (v / 255.0);
  mean /= n;
  double var = 0.0;
  for (int v = 0; v < 256; ++v) {
    const double d = v / 255.0 - mean;
    var += static_cast<double>(counts[static_cast<std::size_t>(v)]) * d * d;
  }
  return {static_cast<float>(mean), static_cast<float>(std::sqrt(var / n))};
}

}  // namespace

DataSplit make_synthetic(std::int64_t train_size, std::int64_t test_size, std::uint64_t seed) {
  GS_CHECK_CONFIG(
      train_size >= 1 && train_size <= kSyntheticMaxSize,
      "synthetic train size " << train_size << " is out of range: expected 1.." << kSyntheticMaxSize);
  GS_CHECK_CONFIG(
      test_size >= 1 && test_size <= kSyntheticMaxSize,
      "synthetic test size " << test_size << " is out of range: expected 1.." << kSyntheticMaxSize);
  // Independent generators for the prototypes, the train samples and the test samples.
  std::mt19937_64 proto_rng(mix_seed(seed, 0));
  std::mt19937_64 train_rng(mix_seed(seed, 1));
  std::mt19937_64 test_rng(mix_seed(seed, 2));
  const auto protos = make_prototypes(proto_rng);

  std::vector<std::uint8_t> train_pixels, test_pixels;
  DataSplit split;
  make_samples(protos, train_rng, train_size, train_pixels, split.train.labels);
  make_samples(protos, test_rng, test_size, test_pixels, split.test.labels);
  const Normalization norm = byte_statistics(train_pixels);
  split.train.images = normalized_images(train_pixels, {train_size, 1, kSyntheticSide, kSyntheticSide}, norm);
  split.test.images = normalized_images(test_pixels, {test_size, 1, kSyntheticSide, kSyntheticSide}, norm);
  split.train.classes = split.test.classes = kSyntheticClasses;
  split.train.name = "synthetic/train";
  split.test.name = "synthetic/test";
  std::ostringstream os;
  os << "synthetic (no files, seed " << seed << "): " << train_size << " train / " << test_size
     << " test images of 1x" << kSyntheticSide << "x" << kSyntheticSide << ", " << kSyntheticClasses
     << " classes, normalised (x/255 - " << std::fixed << std::setprecision(4) << norm.mean << ") / "
     << norm.std;
  split.source = os.str();
  return split;
}

}  // namespace gradscale
