// Softmax cross-entropy with the loss scale applied to its gradient (see softmax_cross_entropy.h).
#include "lib/layers/softmax_cross_entropy.h"

#include <cmath>

#include "lib/layers/precision_ops.h"

namespace gradscale {

LossResult softmax_cross_entropy_fp32(const Tensor& logits, const std::int32_t* labels, double loss_scale,
                                      Tensor* grad, std::int64_t mean_over) {
  GS_CHECK_SHAPE(logits.rank() == 2, "logits must be [N, classes], got " << shape_string(logits.shape()));
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  LossResult r;
  if (grad) grad->resize(logits.shape());
  const std::int64_t over = mean_over > 0 ? mean_over : n;
  const auto scale_over_n = static_cast<float>(loss_scale / static_cast<double>(over));
  for (std::int64_t i = 0; i < n; ++i) {
    const float* z = logits.data() + i * c;
    const std::int32_t y = labels[i];
    GS_CHECK_NUMERIC(y >= 0 && y < c, "label " << y << " of sample " << i << " is outside [0, " << c << ")");
    std::int64_t arg = 0;
    double zmax = z[0];
    for (std::int64_t k = 1; k < c; ++k)
      if (z[k] > zmax) zmax = z[k], arg = k;
    double sum = 0;
    for (std::int64_t k = 0; k < c; ++k) sum += std::exp(static_cast<double>(z[k]) - zmax);
    r.loss += std::log(sum) + zmax - static_cast<double>(z[y]);
    r.correct += arg == y;
    if (grad) {
      float* g = grad->data() + i * c;
      // fp32 gradient (softmax − onehot)/N, times S0 in fp32 before the one rounding to F.
      for (std::int64_t k = 0; k < c; ++k) {
        const auto prob = static_cast<float>(std::exp(static_cast<double>(z[k]) - zmax) / sum);
        g[k] = (prob - (k == y ? 1.0f : 0.0f)) * scale_over_n;
      }
    }
  }
  r.loss /= static_cast<double>(over);
  return r;
}

LossResult softmax_cross_entropy(const Tensor& logits, const std::int32_t* labels, double loss_scale,
                                 const Precision& p, ScaledGrad* grad, StepMonitor* monitor, int layer_id,
                                 std::int64_t mean_over) {
  const LossResult r = softmax_cross_entropy_fp32(logits, labels, loss_scale, grad ? &grad->g : nullptr, mean_over);
  if (grad) {
    grad->scale = loss_scale;
    StepMonitor unused;  // callers without a monitor still round the same way
    StepMonitor& m = monitor ? *monitor : unused;
    m.loss_grad_max_abs = round_gradient(grad->g.data(), static_cast<std::size_t>(grad->g.size()), 1.0f,
                                         GradSite::loss, layer_id, p, m);
  }
  return r;
}

}  // namespace gradscale
