// Seed mixing, the unbiased bounded draw and the per-epoch permutation (see shuffle.h).
#include "lib/data/shuffle.h"

#include <numeric>
#include <utility>

#include "lib/core/error.h"
#include "lib/core/random.h"

namespace gradscale {

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream) {
  // splitmix64 (Steele, Lea, Flood 2014) applied to seed + golden-ratio multiples of the stream index.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t draw_below(std::mt19937_64& rng, std::uint64_t bound) {
  GS_CHECK(bound >= 1, "bound must be at least 1");
  return uniform_below(rng, bound);
}

void epoch_permutation(std::uint64_t seed, std::int64_t epoch, std::int64_t n,
                       std::vector<std::int64_t>& out) {
  GS_CHECK(epoch >= 0 && n >= 0, "epoch " << epoch << " and n " << n << " must be non-negative");
  out.resize(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), std::int64_t{0});
  std::mt19937_64 rng(mix_seed(seed, static_cast<std::uint64_t>(epoch)));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(draw_below(rng, static_cast<std::uint64_t>(i) + 1));
    std::swap(out[static_cast<std::size_t>(i)], out[static_cast<std::size_t>(j)]);
  }
}

}  // namespace gradscale
