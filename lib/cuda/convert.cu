// float32 ↔ fp16 / bf16 storage (see convert.h). fp16 uses the hardware conversion (IEEE RNE with
// subnormals); bf16 uses the exact bit trick of lib/numeric (RNE on the bit pattern). NaNs are encoded
// by hand because the conversion instructions return a canonical NaN, without the sign.
#include "lib/cuda/convert.h"

#include <cstdint>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

constexpr std::uint32_t kAbs = 0x7FFFFFFFu;
constexpr std::uint32_t kInf = 0x7F800000u;
constexpr std::uint32_t kQuiet = 0x00400000u;

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

__global__ void to_fp16_kernel(const float* in, __half* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __ushort_as_half(fp16_bits(in[i]));
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __ushort_as_bfloat16(bf16_bits(in[i]));
}

__global__ void from_fp16_kernel(const __half* in, float* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = fp16_value(__half_as_ushort(in[i]));
}

__global__ void from_bf16_kernel(const __nv_bfloat16* in, float* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = bf16_value(__bfloat16_as_ushort(in[i]));
}

template <class In, class Out>
void launch_convert(void (*kernel)(const In*, Out*, std::size_t), const In* in, Out* out, std::size_t n,
                    cudaStream_t stream) {
  kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(in, out, n);
  GS_CUDA_CHECK_LAUNCH();
}

template <class In, class Out>
void checked_convert(const char* name, void (*kernel)(const In*, Out*, std::size_t), const In* in, Out* out,
                     std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(in != nullptr && out != nullptr,
           "cuda::" << name << " of " << n << " elements got a null pointer");
  launch_convert(kernel, in, out, n, stream);
}

}  // namespace

void to_fp16(const float* in, __half* out, std::size_t n, cudaStream_t stream) {
  checked_convert("to_fp16", to_fp16_kernel, in, out, n, stream);
}
void to_bf16(const float* in, __nv_bfloat16* out, std::size_t n, cudaStream_t stream) {
  checked_convert("to_bf16", to_bf16_kernel, in, out, n, stream);
}
void from_fp16(const __half* in, float* out, std::size_t n, cudaStream_t stream) {
  checked_convert("from_fp16", from_fp16_kernel, in, out, n, stream);
}
void from_bf16(const __nv_bfloat16* in, float* out, std::size_t n, cudaStream_t stream) {
  checked_convert("from_bf16", from_bf16_kernel, in, out, n, stream);
}

}  // namespace gradscale::cuda
