// The float32 bit fields and the one rounding rule of SPEC §2 (round to nearest, ties to even, on the
// integer significand, with F's subnormal quantum below its min normal), for host code
// (lib/numeric/quantize.cpp) and kernels (lib/cuda/round.cuh) alike: one definition, so a value rounds
// to the same bits on the CPU and the GPU.
#pragma once

#include <cstdint>
#include <cstring>

#include "lib/core/host_device.h"

namespace gradscale::float32 {

constexpr std::uint32_t kSign = 0x80000000u;
constexpr std::uint32_t kAbs = 0x7FFFFFFFu;    // all but the sign
constexpr std::uint32_t kInf = 0x7F800000u;    // +inf; larger magnitudes are NaN
constexpr std::uint32_t kQuiet = 0x00400000u;  // a NaN's quiet bit

GS_HOST_DEVICE inline std::uint32_t to_bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

GS_HOST_DEVICE inline float from_bits(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// 2^k as a float for k in [-126, 127] (a normal number: built from its exponent field).
GS_HOST_DEVICE inline float pow2(int k) {
  return from_bits(static_cast<std::uint32_t>(k + 127) << 23);
}

// Rounds the magnitude a (float32 bits, finite, sign clear) to F's precision and subnormal quantum,
// with an unbounded exponent above (overflow is decided by the caller). Returns a float32 value.
GS_HOST_DEVICE inline float round_magnitude(std::uint32_t a, int mantissa_bits, int min_exponent) {
  const int field = static_cast<int>(a >> 23);
  // a = m * 2^(e - 23), m < 2^24.
  const int e = field == 0 ? -126 : field - 127;
  const std::uint32_t m = field == 0 ? (a & 0x7FFFFFu) : ((a & 0x7FFFFFu) | 0x800000u);
  if (m == 0) return 0.0f;
  const int quantum = (e > min_exponent ? e : min_exponent) - mantissa_bits;  // one unit in the last place
  const int drop = quantum - (e - 23);
  if (drop <= 0) return from_bits(a);  // already on F's grid
  if (drop > 25) return 0.0f;          // m / 2^drop < 1/4: rounds to zero
  std::uint32_t r = m >> drop;
  const std::uint32_t rem = m & ((1u << drop) - 1u);
  const std::uint32_t half = 1u << (drop - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  // r * 2^quantum is exact (a value of F, or 2^128 -> inf, which the caller treats as overflow). Below
  // float's normal range (bf16 subnormals: quantum = -133) two power-of-two factors keep it exact (on
  // the GPU too: the build passes --ftz=false).
  if (quantum >= -126) return static_cast<float>(r) * pow2(quantum);
  return static_cast<float>(r) * pow2(quantum + 24) * 0x1p-24f;
}

}  // namespace gradscale::float32
