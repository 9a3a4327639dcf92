// Small elementwise kernels of the CUDA backend's seam (lib/cuda/backend.h): a fill for Tensor, the
// join's scaled sum (SPEC §5), the Add layer's sum and the unscale of ArrayOps — the CPU's fp32
// operations, so the same bits.
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
// p[i] = p[i] / divisor in fp32 (the unscale of a weight gradient handed over by another engine).
void divide(float* p, std::size_t n, float divisor, cudaStream_t stream);

}  // namespace gradscale::cuda
