// Dropout's mask on the GPU (see dropout.h): a grid-stride elementwise kernel.
#include "lib/cuda/dropout.h"

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

__global__ void dropout_kernel(const float* x, const std::uint8_t* keep, float factor, float* y, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = keep[i] ? __fmul_rn(x[i], factor) : 0.0f;
}

}  // namespace

void apply_dropout_mask(const float* x, const std::uint8_t* keep, float factor, float* y, std::size_t n,
                        cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(x != nullptr && keep != nullptr && y != nullptr,
           "cuda::apply_dropout_mask of " << n << " elements got a null pointer");
  dropout_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(x, keep, factor, y, n);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
