// The synthetic dataset: 10 classes of 1x28x28 byte images made from the seed alone (no files), used by
// tests and as the fallback when Fashion-MNIST is absent. Learnable (each class is a prototype of a few
// bright rectangles; samples are shifted, dimmed and noisy copies), but not trivially.
#pragma once

#include <cstdint>

#include "lib/data/dataset.h"

namespace gradscale {

inline constexpr std::int64_t kSyntheticTrainSize = 4096;
inline constexpr std::int64_t kSyntheticTestSize = 1024;
inline constexpr std::int64_t kSyntheticMaxSize = 10'000'000;
inline constexpr int kSyntheticClasses = 10;
inline constexpr int kSyntheticSide = 28;

// A train/test split of the given sizes (each 1..kSyntheticMaxSize, else ConfigError). The same seed
// gives the same bytes on every platform (integer arithmetic and mt19937_64 only); train and test share
// the class prototypes but not their samples. Normalised with the train images' own byte mean and std.
DataSplit make_synthetic(std::int64_t train_size, std::int64_t test_size, std::uint64_t seed);

}  // namespace gradscale
