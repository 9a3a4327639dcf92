// The end of one iteration (see verdict.h).
#include "lib/train/verdict.h"

#include <chrono>

namespace gradscale {

void scaler_verdict(Scaler& scaler, const StepMonitor& monitor, std::int64_t step, StepResult& result) {
  const auto t0 = std::chrono::steady_clock::now();
  if (LayerController* controller = scaler.layer_controller()) controller->end_step(monitor);
  StepStatistics stats;
  stats.found_inf = monitor.found_inf;
  stats.first_nonfinite_layer = monitor.first_nonfinite_layer;
  stats.grad_below_edge = monitor.grad_below_edge;
  stats.grad_above_edge = monitor.grad_above_edge;
  stats.step = step;
  stats.monitor = &monitor;
  result.report = scaler.update(stats);
  result.scaler_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() + monitor.scaler_seconds;
  result.found_inf = stats.found_inf;
  result.first_nonfinite_layer = stats.first_nonfinite_layer;
  result.skipped = result.report.skipped;
  result.phi = result.report.state.is_object() ? result.report.state.value("phi", 1.0) : 1.0;
}

std::vector<LayerScale> layer_scale_rows(const std::vector<LayerInfo>& layers, const StepMonitor& monitor) {
  std::vector<LayerScale> rows;
  rows.reserve(layers.size());
  for (const LayerInfo& info : layers) {
    LayerScale row;
    row.id = info.id;
    row.name = info.name;
    row.kind = info.kind;
    row.parametric = info.parametric;
    if (info.id >= 0 && static_cast<std::size_t>(info.id) < monitor.records.size()) {
      const LayerRecord& r = monitor.records[static_cast<std::size_t>(info.id)];
      row.ran = r.ran;
      row.sent = r.sent_grad;
      row.s = r.local_scale;
      row.unbound = r.unbound_scale;
      row.scale_in = r.scale_in;
      row.scale_out = r.scale_out;
      row.recorded = r.has_activation_grad;
      if (row.recorded) row.underflow_rate = r.activation_grad.underflow_rate();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace gradscale
