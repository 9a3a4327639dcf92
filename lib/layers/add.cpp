// Add (see add.h).
#include "lib/layers/add.h"

#include <cstring>

#include "lib/layers/precision_ops.h"

namespace gradscale {

Shape Add::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 2, "layer '" << name_ << "' (add) takes two inputs, got " << inputs.size());
  GS_CHECK_SHAPE(inputs[0] == inputs[1], "layer '" << name_ << "' (add) needs inputs of one shape, got "
                                                   << shape_string(inputs[0]) << " and "
                                                   << shape_string(inputs[1]));
  return inputs[0];
}

void Add::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) {
  GS_CHECK_SHAPE(inputs.size() == 2, "layer '" << name_ << "' (add) takes two inputs, got " << inputs.size());
  output.resize(output_shape({inputs[0]->shape(), inputs[1]->shape()}));
  const float* a = inputs[0]->data();
  const float* b = inputs[1]->data();
  float* y = output.data();
  for (std::int64_t i = 0; i < output.size(); ++i) y[i] = a[i] + b[i];
  round_output(output, ctx.precision);
}

void Add::backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                   const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) {
  GS_CHECK_SHAPE(grad_inputs.size() == 2, "layer '" << name_ << "' (add): " << grad_inputs.size()
                                                       << " input gradients, not 2");
  check_output_grad(*this, grad_output.g, output);
  // Both inputs get the same gradient at the same scale: decided (when a controller acts here) once.
  const ScaledGrad* sent = nullptr;
  for (ScaledGrad* gx : grad_inputs) {
    if (!gx) continue;
    const Tensor& from = sent ? sent->g : grad_output.g;
    gx->g.resize(from.shape());
    std::memcpy(gx->g.data(), from.data(), static_cast<std::size_t>(from.size()) * sizeof(float));
    if (sent) {
      gx->scale = sent->scale;
    } else {
      send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/false);
      sent = gx;
    }
  }
}

}  // namespace gradscale
