// The adaptive policy's derived bounds (see derived_bounds.h).
#include "adaptive/derived_bounds.h"

#include <cmath>
#include <limits>

#include "lib/core/error.h"

namespace gradscale::adaptive {

void DerivedBounds::observe(const StepMonitor& monitor, const LocalSafety& graph) {
  std::vector<double> seen(downstream_.size(), -1.0);  // -1: no pass-through layer of it ran
  for (const LayerRecord& r : monitor.records) {
    if (!r.ran || !r.sent_grad || r.layer_id < 0 || graph.controlled(r.layer_id)) continue;
    const double m = static_cast<double>(r.sent_max_abs);
    if (!(std::isfinite(m) && r.scale_out > 0 && std::isfinite(r.scale_out))) continue;
    const double unscaled = m / r.scale_out;
    for (int target : graph.received_from(r.layer_id)) {
      if (target < 0) continue;  // the loss scale has its own cap (SPEC §6.5's floor rule)
      const auto t = static_cast<std::size_t>(target);
      if (t >= downstream_.size()) {  // a layer beyond the bound table (a controller used without bind)
        downstream_.resize(t + 1, 0.0);
        seen.resize(t + 1, -1.0);
      }
      if (unscaled > seen[t]) seen[t] = unscaled;
    }
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (seen[i] >= 0) downstream_[i] = seen[i];
}

double DerivedBounds::accum_bound(int layer_id, double u_max, int margin) const {
  const double d = downstream_max(layer_id);
  if (!(d > 0)) return std::numeric_limits<double>::infinity();
  return std::ldexp(u_max, -margin) / d;
}

double DerivedBounds::downstream_max(int layer_id) const {
  if (layer_id < 0 || static_cast<std::size_t>(layer_id) >= downstream_.size()) return 0.0;
  return downstream_[static_cast<std::size_t>(layer_id)];
}

void DerivedBounds::restore(int layer_id, double downstream_max) {
  GS_CHECK(layer_id >= 0, "derived bounds: layer id " << layer_id);
  if (static_cast<std::size_t>(layer_id) >= downstream_.size()) downstream_.resize(static_cast<std::size_t>(layer_id) + 1, 0.0);
  downstream_[static_cast<std::size_t>(layer_id)] = downstream_max;
}

}  // namespace gradscale::adaptive
