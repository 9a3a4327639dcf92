// The scaler interface (see scaler.h): the defaults of a global (loss-level) policy.
#include "lib/scaler/scaler.h"

#include "lib/core/json_read.h"

namespace gradscale {

void Scaler::bind(const std::vector<LayerInfo>& layers, Format grad_format) {
  if (LayerController* c = layer_controller()) c->bind(layers, grad_format);
}

void Scaler::begin_step(std::int64_t step) {
  if (LayerController* c = layer_controller()) c->begin_step(StepBegin{step, phi()});
}

void LayerController::restore_controller_state(const nlohmann::json& state) {
  GS_CHECK_CONFIG(state.is_null(), "this controller keeps no state, but the saved state has "
                                       << json_excerpt(state));
}

double LayerController::weight_grad_scale(const WeightGradQuery& q) {
  return weight_grad_range_scale(q.max_abs, format_info(q.format).max_finite, q.scale_in);
}

double Scaler::choose_loss_scale(const LocalScaleQuery& /*loss_grad*/) {
  return loss_scale();
}

}  // namespace gradscale
