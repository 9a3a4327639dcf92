// Adam / AdamW on the GPU, the twin of lib/optim/adam.cpp: torch.optim.Adam's order of fp32 operations
// per element. The moments are the CPU's bits; the weights too, except when the device's bias-correction
// scalars differ from the CPU's by an ulp (optim_step.h). Skipped steps change nothing.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include "lib/cuda/optim_step.h"
#include "lib/optim/optimizer.h"

namespace gradscale::cuda {

struct AdamParams {
  double lr = 0;  // the same lr as the step's AdamSchedule
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;  // 0 for parameters without weight decay
  bool decoupled = false;   // false: Adam (g += wd·w); true: AdamW (w *= 1 − lr·wd)
};

// Per element, in fp32, unless step->current == 0 (skipped), with the scalars optimizer_begin_step
// computed for this step:
//   AdamW: w = w·(1 − lr·wd)      Adam: g = g + wd·w
//   m = beta1·m + (1 − beta1)·g;  v = beta2·v + (1 − beta2)·g·g
//   w = w + (−lr / (1 − beta1^t))·m / (sqrt(v) / sqrt(1 − beta2^t) + eps)
// w, g, m, v: n device floats (m, v zero before the first step); queued on `stream`. Throws ConfigError
// for options out of range, Error for null pointers.
void adam_update(float* w, const float* g, float* m, float* v, std::size_t n, const AdamParams& p,
                 const DeviceOptimizerStep* step, cudaStream_t stream);

// The training path's entry (lib/optim's DeviceOptimizerKernels): every scalar comes from Adam::update on
// the host (AdamStep), so the weights are the CPU's bits too; the step is always applied. One
// parameter's update: w, g, m, v as above.
struct AdamJob {
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  std::size_t n = 0;
  AdamStep s{};
};
constexpr std::size_t kOptimizerJobsPerLaunch = 32;
// Every job's update in one launch per kOptimizerJobsPerLaunch non-empty jobs (`jobs` on the host, read
// before it returns), queued on `stream`. Throws Error, before anything is launched, for a null pointer
// in a job with n > 0, naming the job.
void adam_update_many(const AdamJob* jobs, std::size_t count, cudaStream_t stream);

}  // namespace gradscale::cuda
