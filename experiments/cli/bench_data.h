// The input of the `gradscale bench` throughput figures (numeric on the CPU, cuda on the GPU), so both
// measure the same data: gradient-like floats with log-uniform magnitudes over 2^-40 .. 2^8, random
// signs and 5% zeros — every rounding class of every format occurs.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gradscale::cli {

inline std::vector<float> gradient_like(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> log2mag(-40.0f, 8.0f);
  std::uniform_int_distribution<int> pct(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) {
    const int p = pct(rng);
    x = p < 5 ? 0.0f : std::exp2(log2mag(rng)) * (p % 2 ? 1.0f : -1.0f);
  }
  return v;
}

}  // namespace gradscale::cli
