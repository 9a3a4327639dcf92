// ReLU: exact in every format (it selects values); the gradient passes at the same scale S.
#pragma once

#include "lib/layers/format_preserving_layer.h"

namespace gradscale {

class ReLU final : public FormatPreservingLayer {
 public:
  using FormatPreservingLayer::FormatPreservingLayer;
  std::string kind() const override { return "relu"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
};

// Flatten [N, ...] -> [N, rest]: a reshape; the gradient passes unchanged.
class Flatten final : public FormatPreservingLayer {
 public:
  using FormatPreservingLayer::FormatPreservingLayer;
  std::string kind() const override { return "flatten"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
};

}  // namespace gradscale
