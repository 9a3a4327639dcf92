// Softmax cross-entropy on the GPU, the twin of lib/layers/softmax_cross_entropy.cpp (SPEC §4–§5): the
// loss in double, and the gradient w.r.t. the logits in fp32 times the loss scale S0 — the entry point of
// the loss scale. The caller rounds the gradient to F (cuda::quantize), as the CPU's round_gradient does.
// exp and log are CUDA's (within 1 ulp in double): the loss and the gradient agree with the CPU's to
// about one fp32 ulp, not bit for bit.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include "lib/cuda/context.h"
#include "lib/cuda/local_scale.h"

namespace gradscale::cuda {

// What the device writes (one record, device memory): the host reads it with the step's statistics.
struct DeviceLoss {
  double loss_sum;       // Σ over samples of the cross-entropy (mean = loss_sum / n)
  long long correct;     // samples with argmax(logits) == label
  long long bad_labels;  // samples whose label is outside [0, classes): their loss is NaN, gradient 0
};

// logits [n, classes] (fp32 device, values in F), labels [n] (int32 device). When grad is not null:
// grad [n, classes] ← (softmax − onehot) · float(S0 / N) in fp32, unrounded, with N = mean_over (0: n;
// data-parallel training gives the whole batch's count). *result ← the sums above.
// Uses ctx.scratch() and ctx.stream(). Throws ShapeError for n < 1 or classes < 1, NumericError for a
// loss scale that is not finite and > 0, Error for null pointers.
void softmax_cross_entropy(CudaContext& ctx, const float* logits, const std::int32_t* labels, std::int64_t n,
                           std::int64_t classes, double loss_scale, float* grad, DeviceLoss* result,
                           std::int64_t mean_over = 0);
// The same with S0 read on the device (`loss_scale`: an entry of a scale table: S0 decided there),
// float(S0 / N) computed there as above: no wait for S0. grad must not be null.
void softmax_cross_entropy(CudaContext& ctx, const float* logits, const std::int32_t* labels, std::int64_t n,
                           std::int64_t classes, const DeviceScale* loss_scale, float* grad, DeviceLoss* result,
                           std::int64_t mean_over = 0);

}  // namespace gradscale::cuda
