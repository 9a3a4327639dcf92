// The divergence check's scan on the GPU (lib/train/divergence.h): for many device tensors at once, the
// index of the first value that is not finite, into one device array — one launch per 32 tensors and
// one small copy for the host, instead of a copy of every parameter.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

struct NonFiniteJob {
  const float* data = nullptr;  // device memory
  std::size_t n = 0;
};

// What first[i] holds for a tensor whose values are all finite.
constexpr unsigned long long kAllFinite = ~0ull;

// first[i] ← the smallest index j with data[j] inf or NaN in jobs[i], or kAllFinite (`jobs` on the host,
// `first` in device memory, count entries; set here, no need to clear). Queued on `stream`. Throws
// Error for null pointers with n > 0, CudaError when a launch fails.
void first_nonfinite(const NonFiniteJob* jobs, std::size_t count, unsigned long long* first, cudaStream_t stream);

}  // namespace gradscale::cuda
