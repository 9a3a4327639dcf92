// ReLU on the GPU, the twin of lib/layers/relu.cpp: it selects values, so it is exact in every format
// and passes the gradient's scale S unchanged (SPEC §5).
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// y[i] = x[i] < 0 ? 0 : x[i] (NaN and -0 pass, as on the CPU); n device floats, queued on `stream`.
void relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream);
// gx[i] = y[i] > 0 ? g[i] : 0, with y the forward's output.
void relu_backward(const float* y, const float* g, float* gx, std::size_t n, cudaStream_t stream);

}  // namespace gradscale::cuda
