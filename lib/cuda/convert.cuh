// float32 ↔ fp16 / bf16 bits in device code (convert.h's conversions, element by element), for the
// kernels that store or read 16-bit values themselves: convert.cu, and im2col.cu writing a GEMM's
// 16-bit operand directly. fp16 uses the hardware conversion (IEEE RNE with subnormals); bf16 uses the
// exact bit trick of lib/numeric (RNE on the bit pattern). NaNs are encoded by hand because the
// conversion instructions return a canonical NaN, without the sign.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "lib/cuda/round.cuh"

namespace gradscale::cuda::bits16 {

using device::kAbs;  // the float32 bit fields of round.cuh
using device::kInf;
using device::kQuiet;

__device__ __forceinline__ std::uint16_t fp16_bits(float x) {
  const std::uint32_t b = __float_as_uint(x);
  if ((b & kAbs) > kInf)  // NaN: sign, 0x7C00, the top 10 payload bits with the quiet bit (encode())
    return static_cast<std::uint16_t>(((b >> 16) & 0x8000u) | 0x7C00u | (((b | kQuiet) & 0x7FFFFFu) >> 13));
  return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float fp16_value(std::uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0)  // NaN: decode() sets the quiet bit
    return __uint_as_float((static_cast<std::uint32_t>(h & 0x8000u) << 16) | kInf | kQuiet |
                           (static_cast<std::uint32_t>(h & 0x3FFu) << 13));
  return __half2float(__ushort_as_half(h));  // exact
}

__device__ __forceinline__ std::uint16_t bf16_bits(float x) {
  const std::uint32_t b = __float_as_uint(x);
  if ((b & kAbs) > kInf) return static_cast<std::uint16_t>((b | kQuiet) >> 16);
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf16_value(std::uint16_t h) {
  std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  if ((b & kAbs) > kInf) b |= kQuiet;  // decode() returns quiet NaNs
  return __uint_as_float(b);
}

}  // namespace gradscale::cuda::bits16
