// Softmax cross-entropy, always in fp32/fp64 (SPEC §4), and the entry of the loss scale (SPEC §5):
// the gradient w.r.t. the logits is computed in fp32, multiplied by S0, then rounded to F.
#pragma once

#include <cstdint>

#include "lib/layers/layer.h"

namespace gradscale {

struct LossResult {
  double loss = 0;           // mean cross-entropy over the batch
  std::int64_t correct = 0;  // argmax(logits) == label
};

// logits [N, classes] (values in F), labels[N] in [0, classes). When `grad` is non-null it receives
// quantize(S0 · ∂loss/∂logits, gradient format) at scale S0, rounded by round_gradient at the loss site
// (statistics when `monitor` records; non-finite values reported under `layer_id`, the output layer).
// Throws NumericError when a label is out of range.
// `mean_over` (0: N) is the count the loss is the mean over: data-parallel training gives the whole
// batch's, so a rank's rows of the gradient are those of the whole batch (and its loss is its share of
// the batch's mean: the ranks' losses sum to it).
LossResult softmax_cross_entropy(const Tensor& logits, const std::int32_t* labels, double loss_scale,
                                 const Precision& p, ScaledGrad* grad, StepMonitor* monitor, int layer_id,
                                 std::int64_t mean_over = 0);
// The same loss and the fp32 gradient S0 · ∂loss/∂logits before rounding (into `grad`, resized to the
// logits' shape; may be null): what a policy that chooses S0 from the loss gradient looks at.
LossResult softmax_cross_entropy_fp32(const Tensor& logits, const std::int32_t* labels, double loss_scale,
                                      Tensor* grad, std::int64_t mean_over = 0);

}  // namespace gradscale
