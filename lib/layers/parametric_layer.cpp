// The parameter plumbing of Linear and Conv2d (see parametric_layer.h).
#include "lib/layers/parametric_layer.h"

#include "lib/layers/precision_ops.h"

namespace gradscale {

std::vector<Parameter*> ParametricLayer::parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

void ParametricLayer::prepare_weights(const Precision& p) {
  round_working_copy(weight_, weight_work_, p);
  if (has_bias_) round_working_copy(bias_, bias_work_, p);
}

void ParametricLayer::infer_sizes(const std::vector<Shape>& inputs, Rng* init_rng) {
  if (!deferred_init_) return;  // sized and drawn at construction, or at an earlier finalize
  infer_input_size(inputs);
  GS_CHECK_CONFIG(init_rng != nullptr, "layer '" << name_ << "': built from " << options_
                                                 << ", its weights are drawn at finalize: call "
                                                 << "Model::finalize(shape, rng)");
  allocate_parameters(*deferred_init_, *init_rng);
  deferred_init_.reset();
}

void ParametricLayer::allocate_weight_and_bias(const Shape& weight_shape, std::int64_t bias_size,
                                               std::int64_t fan_in, std::int64_t fan_out,
                                               const InitSpec& init, Rng& rng) {
  weight_.name = name_ + ".weight";
  weight_.value.reset(weight_shape, 0.0f);
  weight_.grad.reset(weight_shape, 0.0f);
  init_weights(weight_.value, fan_in, fan_out, init, rng);
  if (has_bias_) {
    bias_.name = name_ + ".bias";
    bias_.value.reset({bias_size}, 0.0f);
    bias_.grad.reset({bias_size}, 0.0f);
    bias_.weight_decay = false;
  }
}

void ParametricLayer::accumulate_parameter_grads(double scale, BackwardContext& ctx) {
  if (has_bias_)
    accumulate_weight_grads(*this, {{&grad_w_, &weight_}, {&grad_b_, &bias_}}, scale, ctx);
  else
    accumulate_weight_grads(*this, {{&grad_w_, &weight_}}, scale, ctx);
}

}  // namespace gradscale
