// The per-iteration record of backward (see step_monitor.h).
#include "lib/instrument/step_monitor.h"

#include "lib/core/error.h"

namespace gradscale {

void StepMonitor::reset(int num_layers, bool record_stats, double edge) {
  found_inf = false;
  first_nonfinite_layer = -1;
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
}

LayerRecord& StepMonitor::record_of(int layer_id) {
  GS_CHECK(layer_id >= 0 && static_cast<std::size_t>(layer_id) < records.size(),
           "layer id " << layer_id << " outside the monitor's " << records.size() << " layers");
  return records[static_cast<std::size_t>(layer_id)];
}

}  // namespace gradscale
