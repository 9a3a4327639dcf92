// Global average pooling on the GPU, the twin of lib/layers/pool.cpp's GlobalAvgPool: the mean of each
// H×W plane summed in double in the CPU's order and rounded to fp32 once; backward spreads g / (H·W)
// (an fp32 division, as on the CPU) over the plane. Both give the CPU's bits; the caller rounds to F
// (SPEC §5: the scale S passes unchanged).
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// y[p] = float(Σ_i x[p·plane + i] / plane) for p < planes (device arrays), queued on `stream`.
// Throws ShapeError for planes < 0 or plane < 1.
void global_avg_pool_forward(const float* x, std::int64_t planes, std::int64_t plane, float* y,
                             cudaStream_t stream);
// gx[p·plane + i] = g[p] / float(plane).
void global_avg_pool_backward(const float* g, std::int64_t planes, std::int64_t plane, float* gx,
                              cudaStream_t stream);

}  // namespace gradscale::cuda
