// The device twin of lib/numeric/quantize.cpp's rounding rule, for kernels (device code only). Line
// for line the same integer-significand algorithm as round_magnitude() and quantize_generic(), so a
// value rounds to the same bits on the CPU and the GPU.
#pragma once

#if !defined(__CUDACC__)
#error "lib/cuda/round.cuh holds device code: include it from .cu files only"
#endif

#include <cstdint>

#include "lib/cuda/quantize.h"

namespace gradscale::cuda::device {

constexpr std::uint32_t kSign = 0x80000000u;
constexpr std::uint32_t kAbs = 0x7FFFFFFFu;
constexpr std::uint32_t kInf = 0x7F800000u;
constexpr std::uint32_t kQuiet = 0x00400000u;

// 2^k as a float for k in [-126, 127] (a normal number: built from its exponent field).
__device__ __forceinline__ float pow2(int k) {
  return __uint_as_float(static_cast<std::uint32_t>(k + 127) << 23);
}

// The NaN that rounding the NaN `x` (float32 bits) to F gives: the sign and top payload bits with the
// quiet bit set, or F's single NaN.
__device__ __forceinline__ std::uint32_t rounded_nan(std::uint32_t x, const DeviceRounding& r) {
  if (r.single_nan) return (x & kSign) | kInf | kQuiet;
  return (x | kQuiet) & ~r.nan_drop_mask;
}

// Rounds the magnitude a (float32 bits, finite, sign clear) to F's precision and subnormal quantum with
// an unbounded exponent above; the caller applies the overflow rule. quantize.cpp: round_magnitude.
__device__ __forceinline__ float round_magnitude(std::uint32_t a, int mantissa_bits, int min_exponent) {
  const int field = static_cast<int>(a >> 23);
  // a = m * 2^(e - 23), m < 2^24.
  const int e = field == 0 ? -126 : field - 127;
  const std::uint32_t m = field == 0 ? (a & 0x7FFFFFu) : ((a & 0x7FFFFFu) | 0x800000u);
  if (m == 0) return 0.0f;
  const int quantum = max(e, min_exponent) - mantissa_bits;  // value of one unit in the last place
  const int drop = quantum - (e - 23);
  if (drop <= 0) return __uint_as_float(a);  // already on F's grid
  if (drop > 25) return 0.0f;                // m / 2^drop < 1/4: rounds to zero
  std::uint32_t r = m >> drop;
  const std::uint32_t rem = m & ((1u << drop) - 1u);
  const std::uint32_t half = 1u << (drop - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  // r * 2^quantum is exact (or 2^128 -> inf, an overflow for the caller); below float's normal range
  // two power-of-two factors keep it exact (denormals are kept: the build passes --ftz=false).
  if (quantum >= -126) return static_cast<float>(r) * pow2(quantum);
  return static_cast<float>(r) * pow2(quantum + 24) * 0x1p-24f;
}

// quantize(x, F): quantize.cpp's quantize_generic.
__device__ __forceinline__ float round_to_format(float x, const DeviceRounding& fr) {
  if (fr.identity) return x;
  const std::uint32_t b = __float_as_uint(x);
  const std::uint32_t a = b & kAbs;
  const std::uint32_t sign = b & kSign;
  if (a > kInf) return __uint_as_float(rounded_nan(b, fr));
  float r;
  if (a == kInf) {
    r = __uint_as_float(kInf);
  } else {
    r = round_magnitude(a, fr.mantissa_bits, fr.min_exponent);
    if (r <= fr.max_finite) return __uint_as_float(__float_as_uint(r) | sign);
  }
  // Beyond max finite (or an infinite input): F's overflow rule.
  switch (fr.overflow) {
    case OverflowRule::infinity:
      return __uint_as_float(kInf | sign);
    case OverflowRule::saturate:
      return __uint_as_float(__float_as_uint(fr.max_finite) | sign);
    case OverflowRule::nan:
      break;
  }
  return __uint_as_float(rounded_nan(sign | kInf | kQuiet, fr));
}

}  // namespace gradscale::cuda::device
