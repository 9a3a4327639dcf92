// The float32 bit patterns the instrumentation compares: for a non-negative float the pattern is
// monotone in the value, so |v| against a threshold is an unsigned compare of (bits & kAbsBits).
#pragma once

#include <cstdint>
#include <cstring>

namespace gradscale {

inline constexpr std::uint32_t kAbsBits = 0x7FFFFFFFu;  // all but the sign
inline constexpr std::uint32_t kInfBits = 0x7F800000u;  // +inf; larger patterns are NaN

inline float from_bits(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace gradscale
