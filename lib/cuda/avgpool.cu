// Global average pooling forward and backward on the GPU (see avgpool.h). Forward: one thread per plane
// adds its values in order in double — the CPU's loop, hence its bits (the planes of the models are
// small: 7×7 in resnet-mini). Backward: one thread per input element.
#include "lib/cuda/avgpool.h"

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

__global__ void avg_pool_forward_kernel(const float* x, std::int64_t planes, std::int64_t plane, float* y) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < planes; p += step) {
    double sum = 0;
    for (std::int64_t i = p * plane; i < (p + 1) * plane; ++i) sum += x[i];
    y[p] = static_cast<float>(sum / static_cast<double>(plane));
  }
}

__global__ void avg_pool_backward_kernel(const float* g, std::int64_t planes, std::int64_t plane, float* gx) {
  const std::int64_t total = planes * plane;
  const float count = static_cast<float>(plane);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step)
    gx[t] = g[t / plane] / count;
}

void check_pool(std::int64_t planes, std::int64_t plane, const char* what) {
  GS_CHECK_SHAPE(planes >= 0 && plane >= 1,
                 "cuda::" << what << ": " << planes << " planes of " << plane << " values (need a plane >= 1)");
}

}  // namespace

void global_avg_pool_forward(const float* x, std::int64_t planes, std::int64_t plane, float* y,
                             cudaStream_t stream) {
  check_pool(planes, plane, "global_avg_pool_forward");
  if (planes == 0) return;
  GS_CHECK(x != nullptr && y != nullptr, "cuda::global_avg_pool_forward got a null pointer");
  avg_pool_forward_kernel<<<grid_for(static_cast<std::size_t>(planes)), kBlock, 0, stream>>>(x, planes, plane, y);
  GS_CUDA_CHECK_LAUNCH();
}

void global_avg_pool_backward(const float* g, std::int64_t planes, std::int64_t plane, float* gx,
                              cudaStream_t stream) {
  check_pool(planes, plane, "global_avg_pool_backward");
  if (planes == 0) return;
  GS_CHECK(g != nullptr && gx != nullptr, "cuda::global_avg_pool_backward got a null pointer");
  const auto total = static_cast<std::size_t>(planes * plane);
  avg_pool_backward_kernel<<<grid_for(total, 4), kBlock, 0, stream>>>(g, planes, plane, gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
