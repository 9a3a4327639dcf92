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

// round_magnitude's rule in a few float32 operations, for kernels: the same bits for every finite
// magnitude of every format below fp32 (tests/test_numeric.cpp compares them over every significand of
// the binades where the two could differ), when subnormals are not flushed to zero (lib/cuda is built
// with --ftz=false; a host thread under FTZ/DAZ would flush them). On F's normal range every binade
// drops the same 23 - p low bits, so the bit pattern itself is rounded (ties to even; a carry moves into
// the exponent, up to 2^128 = inf for the caller's overflow rule). Below F's min normal the quantum is
// fixed, 2^q with q = min_exponent - p: adding c = 2^(q + 23), whose ulp is 2^q, rounds a to it (one
// correctly rounded fp32 addition, ties to even), and subtracting c again is exact.
struct FastRounding {
  std::uint32_t min_normal = 0;    // F's smallest normal, as float32 bits
  float addend = 0;                // c = 2^(q + 23)
  std::uint32_t dropped = 0;       // 23 - p, the bits a normal value loses
  std::uint32_t half_minus_one = 0;  // 2^(dropped - 1) - 1
  std::uint32_t keep = 0;          // the bits a normal value keeps
};

// For a format with `mantissa_bits` < 23 explicit fraction bits and min normal 2^min_exponent.
GS_HOST_DEVICE inline FastRounding fast_rounding(int mantissa_bits, int min_exponent) {
  FastRounding r;
  r.min_normal = static_cast<std::uint32_t>(min_exponent + 127) << 23;
  r.addend = pow2(min_exponent - mantissa_bits + 23);
  r.dropped = static_cast<std::uint32_t>(23 - mantissa_bits);
  r.half_minus_one = (1u << (r.dropped - 1)) - 1u;
  r.keep = ~((1u << r.dropped) - 1u);
  return r;
}

// round_magnitude(a, p, min_exponent) for a finite, sign clear, with `r` = fast_rounding(p, min_exponent).
GS_HOST_DEVICE inline float round_magnitude_fast(std::uint32_t a, const FastRounding& r) {
  if (a < r.min_normal) return (from_bits(a) + r.addend) - r.addend;
  return from_bits((a + r.half_minus_one + ((a >> r.dropped) & 1u)) & r.keep);
}

}  // namespace gradscale::float32
