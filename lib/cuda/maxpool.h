// Max pooling on the GPU, the twin of lib/layers/pool.cpp's MaxPool2d: kernel×kernel windows, no
// padding, floor mode; ties go to the first maximum in row-major order and a NaN wins. The backward
// routes each output gradient to its window's maximum at the same scale S (SPEC §5); where windows
// overlap an input sums its gradients in the CPU's order, so the bits are the CPU's.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// [planes = N·C, h, w] -> [planes, ho, wo].
struct PoolGeometry {
  std::int64_t planes = 0, h = 0, w = 0, kernel = 2, stride = 2;
  std::int64_t ho() const { return (h - kernel) / stride + 1; }
  std::int64_t wo() const { return (w - kernel) / stride + 1; }
};

// y[o] = max of window o, argmax[o] = its index in the h×w plane (device arrays of planes·ho·wo).
// Throws ShapeError for kernel/stride < 1 or a plane smaller than the kernel (or over 2^31 elements).
void max_pool_forward(const float* x, const PoolGeometry& g, float* y, std::int32_t* argmax,
                      cudaStream_t stream);
// gx (planes·h·w) = for each input, the sum over the windows whose maximum it is of their gradient gy,
// in increasing output index (0 where none), from the forward's argmax.
void max_pool_backward(const float* gy, const std::int32_t* argmax, const PoolGeometry& g, float* gx,
                       cudaStream_t stream);

}  // namespace gradscale::cuda
