// The device twin of lib/numeric/quantize.cpp's quantize_generic(), for kernels (device code only):
// the magnitude rounded by round_magnitude_fast (lib/numeric/round_rule.h: round_magnitude's bits for
// every finite magnitude, in a few fp32 operations; the kernels are built with --ftz=false, which it
// needs), the overflow and NaN rules line for line quantize_generic()'s, so a value rounds to the same
// bits on the CPU and the GPU.
#pragma once

#if !defined(__CUDACC__)
#error "lib/cuda/round.cuh holds device code: include it from .cu files only"
#endif

#include <cstdint>

#include "lib/cuda/quantize.h"
#include "lib/numeric/round_rule.h"

namespace gradscale::cuda::device {

using float32::kAbs;
using float32::kInf;
using float32::kQuiet;
using float32::kSign;
using float32::round_magnitude_fast;

// The NaN that rounding the NaN `x` (float32 bits) to F gives: the sign and top payload bits with the
// quiet bit set, or F's single NaN.
__device__ __forceinline__ std::uint32_t rounded_nan(std::uint32_t x, const DeviceRounding& r) {
  if (r.single_nan) return (x & kSign) | kInf | kQuiet;
  return (x | kQuiet) & ~r.nan_drop_mask;
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
    r = round_magnitude_fast(a, fr.magnitude);
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
