// SGD (momentum, Nesterov, coupled weight decay) on the GPU, the twin of lib/optim/sgd.cpp: torch.optim.SGD's
// order of fp32 operations per element, so the same bits as the CPU. The step is applied or skipped on
// the device (optim_step.h): a skipped step changes nothing.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include "lib/cuda/optim_step.h"
#include "lib/optim/optimizer.h"

namespace gradscale::cuda {

struct SgdParams {
  double lr = 0;            // enters as float, like torch's Python scalars
  double momentum = 0;      // [0, 1); 0 keeps no buffer
  bool nesterov = false;    // requires momentum > 0
  double weight_decay = 0;  // coupled L2 (0 for parameters without weight decay)
};

// Per element, in fp32, unless step->current == 0 (skipped):
//   d = g + wd·w (when wd != 0);  b = d on the first applied step (current == 1), else momentum·b + d;
//   u = d + momentum·b (Nesterov) or b (or d when momentum == 0);  w = w − lr·u.
// w, g, momentum_buffer (null iff momentum == 0): n device floats; queued on `stream` after
// optimizer_begin_step. Throws ConfigError for options out of range, Error for null pointers.
void sgd_update(float* w, const float* g, float* momentum_buffer, std::size_t n, const SgdParams& p,
                const DeviceOptimizerStep* step, cudaStream_t stream);

// The training path's entry (lib/optim's DeviceOptimizerKernels): the scalars come from Sgd::update on the
// host (SgdStep) and the step is always applied (ScaledTraining decides skips on the host). One
// parameter's update: w, g, momentum_buffer (null iff momentum == 0) as above.
struct SgdJob {
  float* w = nullptr;
  const float* g = nullptr;
  float* momentum_buffer = nullptr;
  std::size_t n = 0;
  SgdStep s{};
};
// Every job's update in one launch per 32 non-empty jobs (`jobs` on the host, read before it returns),
// queued on `stream`. Throws Error, before anything is launched, for a null pointer in a job with n > 0
// or a momentum buffer given when momentum is 0 (or missing when it is not), naming the job.
void sgd_update_many(const SgdJob* jobs, std::size_t count, cudaStream_t stream);

}  // namespace gradscale::cuda
