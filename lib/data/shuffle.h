// Deterministic random draws for the data pipeline: seed mixing, an unbiased bounded draw and the
// per-epoch Fisher–Yates permutation that fixes the mini-batch order (see docs/data.md).
// Built only on std::mt19937_64, whose output the C++ standard fixes, so orders agree on every platform.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace gradscale {

// A well-mixed 64-bit seed for sub-stream `stream` of `seed` (the splitmix64 finaliser of a combination
// of both). Distinct (seed, stream) pairs give unrelated generator seeds.
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream);

// A uniform draw from [0, bound), bound >= 1, by rejection: raw outputs below 2^64 mod bound are
// redrawn, so every result has exactly the same number of preimages (no modulo bias). Unlike
// std::uniform_int_distribution its results are the same on every standard library.
std::uint64_t draw_below(std::mt19937_64& rng, std::uint64_t bound);

// The order of epoch `epoch` (>= 0) over n (>= 0) items: `out` becomes a permutation of 0..n-1, the
// Fisher–Yates shuffle of the identity driven by mt19937_64(mix_seed(seed, epoch)). `out` is resized to
// n in place, so a caller that reuses it does not allocate after the first call.
void epoch_permutation(std::uint64_t seed, std::int64_t epoch, std::int64_t n,
                       std::vector<std::int64_t>& out);

}  // namespace gradscale
