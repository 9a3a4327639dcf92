// SPEC §5's local-scale step and §6.5's weight-gradient factor r (see scale_step.h), with the query and
// the checked decision of upstream_decision.h: the one implementation the CPU layers, the CUDA backend
// and ExternalBackward call.
#include "lib/layers/scale_step.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/scaler/scaler.h"

namespace gradscale {

LocalScaleQuery upstream_query(int layer_id, std::string_view layer_name, std::int64_t step, Format format,
                               double scale_in, std::int64_t reduction, const Shape& grad_shape,
                               const Shape& weight_shape, const Shape& upstream_shape) {
  LocalScaleQuery q;
  q.layer_id = layer_id;
  q.layer_name = layer_name;
  q.step = step;
  q.format = format;
  q.scale_in = scale_in;
  q.reduction = reduction;
  q.grad_shape = grad_shape;
  q.weight_shape = weight_shape;
  q.upstream_shape = upstream_shape;
  q.grad_size = shape_size(grad_shape);
  q.weight_size = shape_size(weight_shape);
  q.upstream_size = shape_size(upstream_shape);
  return q;
}

void check_local_scale(double s, std::string_view policy, std::string_view layer_name) {
  GS_CHECK_NUMERIC(std::isfinite(s) && s > 0, "the controller of policy '" << policy << "' chose local scale "
                                                                           << s << " at layer '" << layer_name
                                                                           << "' (must be finite and > 0)");
}

LocalScale checked_decision(LayerController& controller, const LocalScaleQuery& q, std::string_view policy,
                            StepMonitor& monitor, std::chrono::steady_clock::time_point start) {
  const LocalScale decision = controller.decide(q);
  check_local_scale(decision.s, policy, q.layer_name);
  monitor.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return decision;
}

LocalScale decide_local_scale(LayerController& controller, LocalScaleQuery q, const AttachStatistics& attach,
                              StatisticsReducer* reducer, std::string_view policy, StepMonitor& monitor,
                              std::chrono::steady_clock::time_point start) {
  QueryStatistics stats;  // what q points at: kept until the decision is made
  attach(controller.needs(q.layer_id), stats, q);
  if (reducer) stats.reduce(*reducer, q);
  return checked_decision(controller, q, policy, monitor, start);
}

double send_at_local_scale(StepMonitor& monitor, int layer_id, const LocalScale& decision, double scale_in,
                           const std::function<void(float multiplier)>& round) {
  LayerRecord& r = monitor.record_of(layer_id);
  r.local_scale = decision.s;
  r.unbound_scale = decision.unbound;
  r.scale_limit = decision.limit;
  r.sent_grad = true;
  round(static_cast<float>(decision.s));
  const double scale_out = decision.s * scale_in;
  if (!std::isnan(scale_in)) r.scale_out = scale_out;
  return scale_out;
}

LayerController* weight_grad_controller(Scaler& scaler, const Precision& p) {
  LayerController* controller = scaler.layer_controller();
  if (controller == nullptr || !controller->scales_weight_grads() || !p.quantize_weight_grads) return nullptr;
  return controller;
}

double checked_weight_grad_scale(LayerController& controller, int layer_id, std::string_view layer_name,
                                 std::int64_t step, Format format, double scale_in, double max_abs,
                                 std::string_view policy) {
  WeightGradQuery q;
  q.layer_id = layer_id;
  q.layer_name = layer_name;
  q.step = step;
  q.format = format;
  q.scale_in = scale_in;
  q.max_abs = max_abs;
  const double r = controller.weight_grad_scale(q);
  int e = 0;
  GS_CHECK_NUMERIC(std::isfinite(r) && r > 0 && std::frexp(r, &e) == 0.5,
                   "the controller of policy '" << policy << "' chose weight-gradient scale " << r
                                                << " at layer '" << layer_name
                                                << "' (must be a finite power of two > 0)");
  return r;
}

void keep_smallest_weight_grad_scale(LayerRecord& record, double r, bool first) {
  record.weight_grad_scale = first ? r : std::min(record.weight_grad_scale, r);
}

}  // namespace gradscale
