// The optimizer's step counter on the GPU. A step with found_inf is skipped (SPEC §6.4) and its
// weights, moments and step count stay as they were — decided on the device from the found_inf flag
// (unscale.h), so the host never waits for it. optimizer_begin_step runs once per optimizer step, before
// the update kernels of every parameter (sgd.h, adam.h), which read the decision from here.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// Lives in device memory; zero it (all fields 0) before the first step, like a new Optimizer.
struct DeviceOptimizerStep {
  long long applied;                 // applied steps so far: Optimizer::step_count()
  long long current;                 // the 1-based number of the step being applied, 0 when it is skipped
  float adam_neg_step_size;          // Adam: −lr / (1 − beta1^t), as float
  float adam_bias_correction2_sqrt;  // Adam: sqrt(1 − beta2^t), as float
};

// Adam's scalars for the bias correction, computed on the device from the step number t.
struct AdamSchedule {
  double lr = 0, beta1 = 0.9, beta2 = 0.999;
};

// One thread: when *skip_flag != 0 (or skip_flag is null: never skipped) marks the step skipped
// (current = 0); else current = ++applied and, when `adam` is not null, computes Adam's scalars as
// lib/optim/adam.cpp does in double (CUDA's pow is within 2 ulp in double, so the float scalars may,
// rarely, differ from the CPU's by one ulp). Queued on `stream`.
void optimizer_begin_step(const int* skip_flag, DeviceOptimizerStep* step, const AdamSchedule* adam,
                          cudaStream_t stream);

}  // namespace gradscale::cuda
