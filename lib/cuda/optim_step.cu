// The device-side step counter (see optim_step.h): a one-thread kernel between the backward pass and
// the parameter updates.
#include "lib/cuda/optim_step.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"

namespace gradscale::cuda {
namespace {

__global__ void begin_step_kernel(const int* skip_flag, DeviceOptimizerStep* step, bool with_adam,
                                  AdamSchedule adam) {
  if (skip_flag != nullptr && *skip_flag != 0) {
    step->current = 0;
    return;
  }
  const long long t = step->applied + 1;
  step->applied = t;
  step->current = t;
  if (!with_adam) return;
  // adam.cpp: bias corrections in double (torch's Python scalars), then floats where they meet tensors.
  const double bias_correction1 = 1.0 - pow(adam.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - pow(adam.beta2, static_cast<double>(t));
  step->adam_neg_step_size = static_cast<float>(-(adam.lr / bias_correction1));
  step->adam_bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
}

void launch_begin_step(const int* skip_flag, DeviceOptimizerStep* step, bool with_adam,
                       const AdamSchedule& adam, cudaStream_t stream) {
  begin_step_kernel<<<1, 1, 0, stream>>>(skip_flag, step, with_adam, adam);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void optimizer_begin_step(const int* skip_flag, DeviceOptimizerStep* step, const AdamSchedule* adam,
                          cudaStream_t stream) {
  GS_CHECK(step != nullptr, "cuda::optimizer_begin_step got a null step counter");
  if (adam != nullptr)
    GS_CHECK_CONFIG(std::isfinite(adam->lr) && adam->lr >= 0 && adam->beta1 >= 0 && adam->beta1 < 1 &&
                        adam->beta2 >= 0 && adam->beta2 < 1,
                    "cuda::optimizer_begin_step: Adam needs a finite lr >= 0 and betas in [0, 1), got lr "
                        << adam->lr << ", betas " << adam->beta1 << ", " << adam->beta2);
  launch_begin_step(skip_flag, step, adam != nullptr, adam != nullptr ? *adam : AdamSchedule{}, stream);
}

}  // namespace gradscale::cuda
