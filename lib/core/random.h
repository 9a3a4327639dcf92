// Deterministic random draws on every platform: std::mt19937_64 bits turned into uniforms and
// normals by fixed formulas (the standard distributions are implementation-defined).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace gradscale {

using Rng = std::mt19937_64;

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(Rng& rng) {
  return static_cast<double>(rng() >> 11) * 0x1p-53;
}

// Standard normal by Box–Muller (one value per call; the second is discarded for simplicity).
inline double standard_normal(Rng& rng) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform integer in [0, n), n > 0, without modulo bias: raw draws below 2^64 mod n (the short,
// biased tail) are rejected, so the accepted range is a whole number of copies of [0, n).
inline std::uint64_t uniform_below(Rng& rng, std::uint64_t n) {
  const std::uint64_t reject_below = (0 - n) % n;
  std::uint64_t r = rng();
  while (r < reject_below) r = rng();
  return r % n;
}

}  // namespace gradscale
