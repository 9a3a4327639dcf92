// Residual join in the forward pass: y = a + b rounded to F. Backward hands the same gradient, at the
// same scale S, to both inputs; merging gradients that meet at a forked tensor (SPEC §5's join rule)
// is the model's job, not this layer's.
#pragma once

#include "lib/layers/layer.h"

namespace gradscale {

class Add final : public Layer {
 public:
  using Layer::Layer;
  std::string kind() const override { return "add"; }
  int num_inputs() const override { return 2; }
  // Two inputs of the same shape; the output has that shape.
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // Each non-null grad_inputs[i] receives a copy of the output gradient and its scale.
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  // The sum is rounded to F; the gradients are copies of the output gradient.
  bool output_in_format(bool) const override { return true; }
  bool input_grads_in_format(bool out) const override { return out; }
};

}  // namespace gradscale
