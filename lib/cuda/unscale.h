// The end of a backward pass on the GPU (SPEC §4): every weight gradient g (in F, at scale S) is divided
// by S in fp32 and added to its fp32 master gradient, and any non-finite value sets a found_inf flag in
// device memory — for all parameters in one launch per 32 tensors, with no host synchronisation (the
// optimizer kernels read the flag on the device, optim_step.h).
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// One tensor: n values at `grad` (device), unscaled into `master` (device), or only checked when
// `master` is null (activation gradients).
struct UnscaleJob {
  const float* grad = nullptr;
  float* master = nullptr;
  std::size_t n = 0;
  double scale = 1.0;  // S: finite and > 0; enters as float, like the CPU's accumulate_weight_grad
  const double* scale_on_device = nullptr;  // S in device memory instead (a scale decided on the device)
};

// For every job and i < n: master[i] = master[i] + grad[i] / float(S) (the CPU's fp32 operations, so the
// same bits); *found_inf = 1 when some grad[i] or some result is not finite (the flag is only ever set:
// the caller clears it at the start of a step). Queued on `stream`. Throws NumericError for a host scale
// that is not finite and > 0 (a scale on the device is the caller's to check), Error for null pointers, CudaError when a launch fails.
void unscale_accumulate(const UnscaleJob* jobs, std::size_t count, int* found_inf, cudaStream_t stream);
inline void unscale_accumulate(const std::vector<UnscaleJob>& jobs, int* found_inf, cudaStream_t stream) {
  unscale_accumulate(jobs.data(), jobs.size(), found_inf, stream);
}

}  // namespace gradscale::cuda
