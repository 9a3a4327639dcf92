// The found_inf scans (see finite_scan.h): branch-free loops over the bit patterns, so they vectorise.
#include "lib/instrument/finite_scan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/instrument/float_bits.h"

namespace gradscale {

float max_abs(const float* v, std::size_t n) {
  // Unsigned max of the magnitude bits, with NaN clamped to inf's pattern: branch-free, vectorises.
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, v + i, sizeof b);
    m = std::max(m, std::min(b & kAbsBits, kInfBits));
  }
  return from_bits(m);
}

bool all_finite(const float* v, std::size_t n) {
  // OR of (|v| >= inf) over the array, branch-free so it vectorises; one test per 1024 elements.
  std::size_t i = 0;
  while (i < n) {
    const std::size_t end = std::min(n, i + 1024);
    std::uint32_t bad = 0;
    for (; i < end; ++i) {
      std::uint32_t b;
      std::memcpy(&b, v + i, sizeof b);
      bad |= static_cast<std::uint32_t>((b & kAbsBits) >= kInfBits);
    }
    if (bad) return false;
  }
  return true;
}

std::int64_t first_nonfinite(const float* v, std::size_t n) {
  if (all_finite(v, n)) return -1;  // the vectorised scan; the index is searched only when there is one
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return static_cast<std::int64_t>(i);
  return -1;
}

}  // namespace gradscale
