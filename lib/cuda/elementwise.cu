// Elementwise kernels of the seam (see elementwise.h).
#include "lib/cuda/elementwise.h"

#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

__global__ void fill_kernel(float* p, std::size_t n, float value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = value;
}

__global__ void scale_add_kernel(const float* src, float factor, float* dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = dst[i] + src[i] * factor;
}

__global__ void add_kernel(const float* a, const float* b, float* y, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = a[i] + b[i];
}

__global__ void divide_kernel(float* p, std::size_t n, float divisor) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = p[i] / divisor;
}

}  // namespace

void fill(float* p, std::size_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(p != nullptr, "cuda::fill of " << n << " elements got a null pointer");
  fill_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(p, n, value);
  GS_CUDA_CHECK_LAUNCH();
}

void scale_add(const float* src, float factor, float* dst, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(src != nullptr && dst != nullptr, "cuda::scale_add of " << n << " elements got a null pointer");
  scale_add_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(src, factor, dst, n);
  GS_CUDA_CHECK_LAUNCH();
}

void add(const float* a, const float* b, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(a != nullptr && b != nullptr && y != nullptr, "cuda::add of " << n << " elements got a null pointer");
  add_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(a, b, y, n);
  GS_CUDA_CHECK_LAUNCH();
}

void divide(float* p, std::size_t n, float divisor, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(p != nullptr, "cuda::divide of " << n << " elements got a null pointer");
  divide_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(p, n, divisor);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
