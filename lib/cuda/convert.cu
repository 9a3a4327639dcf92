// float32 ↔ fp16 / bf16 storage (see convert.h), elementwise over the conversions of convert.cuh.
#include "lib/cuda/convert.h"

#include <cstdint>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/convert.cuh"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

using bits16::bf16_bits;
using bits16::bf16_value;
using bits16::fp16_bits;
using bits16::fp16_value;

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
