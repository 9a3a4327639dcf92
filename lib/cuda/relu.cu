// ReLU forward and backward on the GPU (see relu.h): grid-stride elementwise kernels.
#include "lib/cuda/relu.h"

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

__global__ void relu_backward_kernel(const float* y, const float* g, float* gx, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    gx[i] = y[i] > 0.0f ? g[i] : 0.0f;
}

void launch_relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  relu_forward_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(x, y, n);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_relu_backward(const float* y, const float* g, float* gx, std::size_t n, cudaStream_t stream) {
  relu_backward_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(y, g, gx, n);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(x != nullptr && y != nullptr, "cuda::relu_forward of " << n << " elements got a null pointer");
  launch_relu_forward(x, y, n, stream);
}

void relu_backward(const float* y, const float* g, float* gx, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(y != nullptr && g != nullptr && gx != nullptr,
           "cuda::relu_backward of " << n << " elements got a null pointer");
  launch_relu_backward(y, g, gx, n, stream);
}

}  // namespace gradscale::cuda
