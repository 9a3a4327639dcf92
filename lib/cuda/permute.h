// Swapping the two outer dimensions of a tensor on the GPU: [a, b, inner] -> [b, a, inner]. A convolution
// keeps its gradient as [n, O, Ho·Wo] and its batch-wide GEMMs want [O, n·Ho·Wo]; this is the copy
// between the two. It moves values, so it is exact.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// y[j, i, k] = x[i, j, k] for i < a, j < b, k < inner (device arrays of a·b·inner floats, not
// overlapping), queued on `stream`. Throws ShapeError for a negative dimension.
void swap_outer(const float* x, std::int64_t a, std::int64_t b, std::int64_t inner, float* y, cudaStream_t stream);

}  // namespace gradscale::cuda
