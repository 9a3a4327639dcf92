// swap_outer on the GPU (see permute.h): one thread per output element, so the writes are coalesced and
// the reads are runs of `inner` contiguous floats.
#include "lib/cuda/permute.h"

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

__global__ void swap_outer_kernel(const float* x, std::int64_t a, std::int64_t b, std::int64_t inner, float* y) {
  const std::int64_t total = a * b * inner;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const std::int64_t k = t % inner, i = (t / inner) % a, j = t / (inner * a);  // y[j, i, k]
    y[t] = x[(i * b + j) * inner + k];
  }
}

void launch_swap_outer(const float* x, std::int64_t a, std::int64_t b, std::int64_t inner, float* y,
                       cudaStream_t stream) {
  const auto total = static_cast<std::size_t>(a * b * inner);
  swap_outer_kernel<<<grid_for(total, 4), kBlock, 0, stream>>>(x, a, b, inner, y);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swap_outer(const float* x, std::int64_t a, std::int64_t b, std::int64_t inner, float* y, cudaStream_t stream) {
  GS_CHECK_SHAPE(a >= 0 && b >= 0 && inner >= 0,
                 "cuda::swap_outer: dimensions [" << a << ", " << b << ", " << inner << "] must be >= 0");
  if (a == 0 || b == 0 || inner == 0) return;
  GS_CHECK(x != nullptr && y != nullptr, "cuda::swap_outer got a null pointer");
  launch_swap_outer(x, a, b, inner, y, stream);
}

}  // namespace gradscale::cuda
