// Small elementwise kernels of the CUDA backend's seam (lib/cuda/backend.h): a fill for Tensor, the
// join's scaled sum (SPEC §5) and the Add layer's sum — the CPU's fp32 operations, so the same bits.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// p[i] = value for i < n (device), queued on `stream`.
void fill(float* p, std::size_t n, float value, cudaStream_t stream);
// dst[i] = dst[i] + src[i]·factor (one fp32 product, one fp32 sum: lib/model/join.cpp's loop).
void scale_add(const float* src, float factor, float* dst, std::size_t n, cudaStream_t stream);
// y[i] = a[i] + b[i] (lib/layers/add.cpp).
void add(const float* a, const float* b, float* y, std::size_t n, cudaStream_t stream);

}  // namespace gradscale::cuda
