// The per-iteration record of backward (see step_monitor.h).
#include "lib/instrument/step_monitor.h"

#include <cmath>

#include "lib/core/error.h"

namespace gradscale {

void StepMonitor::reset(int num_layers, bool record_stats, double edge) {
  found_inf = false;
  first_nonfinite_layer = -1;
  nonfinite_stored = false;
  loss_overflow = false;
  loss_overflow_max_abs = 0;
  record = record_stats;
  gradient_edge = edge;
  grad_below_edge = grad_above_edge = 0;
  records.assign(static_cast<std::size_t>(num_layers), LayerRecord{});
  for (int i = 0; i < num_layers; ++i) records[static_cast<std::size_t>(i)].layer_id = i;
  loss_grad_max_abs = 0;
  loss_grad = TensorStats{};
  has_loss_grad = false;
  loss = 0;
  correct = 0;
  scaler_seconds = 0;
}

void StepMonitor::note_nonfinite(int layer_id) {
  if (!found_inf) first_nonfinite_layer = layer_id;
  found_inf = true;
  nonfinite_stored = true;
}

void StepMonitor::note_overflow(GradSite site, int node, float max_abs_before, bool stored_nonfinite) {
  if (!found_inf) first_nonfinite_layer = node;
  found_inf = true;
  nonfinite_stored = nonfinite_stored || stored_nonfinite;
  const auto larger = [](float a, float b) { return std::isnan(b) || b > a ? b : a; };
  if (site == GradSite::loss) {
    loss_overflow = true;
    loss_overflow_max_abs = larger(loss_overflow_max_abs, max_abs_before);
    return;
  }
  if (node < 0 || static_cast<std::size_t>(node) >= records.size()) return;  // an engine outside the layer table
  LayerRecord& r = records[static_cast<std::size_t>(node)];
  (site == GradSite::join ? r.overflow_join : site == GradSite::weight ? r.overflow_weight : r.overflow_upstream) = true;
  r.overflow_max_abs = larger(r.overflow_max_abs, max_abs_before);
}

LayerRecord& StepMonitor::record_of(int layer_id) {
  GS_CHECK(layer_id >= 0 && static_cast<std::size_t>(layer_id) < records.size(),
           "layer id " << layer_id << " outside the monitor's " << records.size() << " layers");
  return records[static_cast<std::size_t>(layer_id)];
}

}  // namespace gradscale
