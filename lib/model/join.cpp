// The backward join of SPEC §5 (see join.h).
#include "lib/model/join.h"

#include <algorithm>
#include <cmath>

#include "lib/layers/precision_ops.h"
#include "lib/model/join_target.h"

namespace gradscale {

double join_target_scale(const std::vector<double>& max_abs, const std::vector<double>& scales, Format f) {
  GS_CHECK(!scales.empty() && max_abs.size() == scales.size(), "join of " << scales.size() << " scales");
  for (double s : scales)
    GS_CHECK_NUMERIC(std::isfinite(s) && s > 0, "join: scale " << s << " is not finite and > 0");
  return join_target(max_abs.data(), scales.data(), static_cast<int>(scales.size()), format_info(f).max_finite);
}

void sum_scaled_parts(const float* const* parts, const double* scales, std::size_t count, double target,
                      float* out, std::size_t n) {
  std::fill(out, out + n, 0.0f);
  for (std::size_t k = 0; k < count; ++k) {
    const auto factor = static_cast<float>(target / scales[k]);
    const float* g = parts[k];
    for (std::size_t i = 0; i < n; ++i) out[i] += g[i] * factor;
  }
}

void join_scaled_grads(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                       StepMonitor& monitor, int node_id, StatisticsReducer* reducer) {
  GS_CHECK(!parts.empty(), "join of no gradients");
  std::vector<double> max_abs_parts, scales;
  std::vector<const float*> values;
  for (const ScaledGrad* part : parts) {
    GS_CHECK_SHAPE(part->g.shape() == parts[0]->g.shape(), "join: gradient shapes "
                                                               << shape_string(part->g.shape()) << " and "
                                                               << shape_string(parts[0]->g.shape()));
    // max |g| from lib/instrument, where NaN counts as infinite (nothing fits a non-finite part).
    max_abs_parts.push_back(max_abs(part->g.data(), static_cast<std::size_t>(part->g.size())));
    scales.push_back(part->scale);
    values.push_back(part->g.data());
  }
  if (reducer) reducer->reduce_max(max_abs_parts.data(), max_abs_parts.size());
  const double target = join_target_scale(max_abs_parts, scales, p.gradient_format());
  out.g.resize(parts[0]->g.shape());
  float* dst = out.g.data();
  const auto n = static_cast<std::size_t>(out.g.size());
  sum_scaled_parts(values.data(), scales.data(), values.size(), target, dst, n);
  out.scale = target;
  round_gradient(dst, n, 1.0f, GradSite::join, node_id, p, monitor);
}

}  // namespace gradscale
