// The end of one iteration (see verdict.h).
#include "lib/train/verdict.h"

#include <chrono>
#include <cmath>

#include "lib/layers/precision_ops.h"

namespace gradscale {

double choose_loss_scale(Scaler& scaler, const float* g, const Shape& shape, std::int64_t step, const Precision& p,
                         StatisticsReducer* reducer) {
  LocalScaleQuery query;
  QueryStatistics stats;
  if (const StatNeeds needs = scaler.loss_needs()) {
    query.layer_name = "loss";
    query.step = step;
    query.format = p.gradient_format();
    query.reduction = 0;
    query.grad_shape = shape;
    query.grad = g;
    query.grad_size = shape_size(shape);
    // The values S0 will multiply before the one rounding: the "upstream" of this cast point.
    query.upstream_shape = shape;
    query.upstream = g;
    query.upstream_size = query.grad_size;
    stats.attach(needs, query, p.round);
    if (reducer) stats.reduce(*reducer, query);
  }
  const double s0 = scaler.choose_loss_scale(query);
  GS_CHECK_NUMERIC(std::isfinite(s0) && s0 > 0, "scaler '" << scaler.policy() << "' chose loss scale " << s0);
  return s0;
}

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
  result.phi = scaler.phi();
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
