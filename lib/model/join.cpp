// The backward join of SPEC §5 (see join.h).
#include "lib/model/join.h"

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

void join_scaled_grads(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                       StepMonitor& monitor, int node_id, StatisticsReducer* reducer) {
  GS_CHECK(!parts.empty(), "join of no gradients");
  std::vector<double> max_abs_parts, scales;
  for (const ScaledGrad* part : parts) {
    GS_CHECK_SHAPE(part->g.shape() == parts[0]->g.shape(), "join: gradient shapes "
                                                               << shape_string(part->g.shape()) << " and "
                                                               << shape_string(parts[0]->g.shape()));
    // max |g| from lib/instrument, where NaN counts as infinite (nothing fits a non-finite part).
    max_abs_parts.push_back(max_abs(part->g.data(), static_cast<std::size_t>(part->g.size())));
    scales.push_back(part->scale);
  }
  if (reducer) reducer->reduce_max(max_abs_parts.data(), max_abs_parts.size());
  const double target = join_target_scale(max_abs_parts, scales, p.gradient_format());
  out.g.resize(parts[0]->g.shape());
  out.g.fill(0.0f);
  float* dst = out.g.data();
  for (const ScaledGrad* part : parts) {
    const auto factor = static_cast<float>(target / part->scale);
    const float* g = part->g.data();
    for (std::int64_t i = 0; i < out.g.size(); ++i) dst[i] += g[i] * factor;
  }
  out.scale = target;
  round_gradient(dst, static_cast<std::size_t>(out.g.size()), 1.0f, GradSite::join, node_id, p, monitor);
}

}  // namespace gradscale
