// Pooling layers (SPEC §5: pooling passes the scale S through unchanged). MaxPool2d selects values, so
// its output and (without overlapping windows) its gradient stay exactly in F; GlobalAvgPool divides by
// H·W, which is not exact in F, so its output and its gradient are rounded to F again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/layers/format_preserving_layer.h"

namespace gradscale {

// Max pooling over kernel×kernel windows without padding (PyTorch's floor mode):
// [N, C, H, W] -> [N, C, (H − kernel) / stride + 1, (W − kernel) / stride + 1].
class MaxPool2d final : public FormatPreservingLayer {
 public:
  // stride 0 means stride = kernel (the PyTorch default).
  MaxPool2d(std::string name, std::int64_t kernel, std::int64_t stride = 0);

  std::string kind() const override { return "maxpool2d"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  // Keeps the position of each window's maximum (ties: the first in row-major order; a NaN wins).
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // Routes each output gradient to its window's maximum at the same scale S. With overlapping windows
  // (stride < kernel) an input can collect several gradients; their fp32 sum is rounded to F.
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  nlohmann::json describe() const override;
  // Selects values: the output is in F when the input is (FormatPreservingLayer); the gradient is
  // rounded again where windows overlap, else it is a selection of the output gradient.
  bool input_grads_in_format(bool out) const override { return stride_ < kernel_ || out; }

 private:
  std::int64_t kernel_, stride_;
  std::vector<std::int32_t> argmax_;  // per output element: index of the maximum in its H×W plane
};

// MaxPool2d's backward check, shared with its CUDA twin: ShapeError naming `layer` unless the output
// gradient has the shape of the last forward's output and that forward recorded one maximum per output
// element (`argmax_size` of them).
void check_max_pool_grad(const Layer& layer, const Tensor& grad_output, const Tensor& output,
                         std::size_t argmax_size);

// Mean over the spatial dimensions: [N, C, H, W] -> [N, C], rounded to F.
class GlobalAvgPool final : public Layer {
 public:
  using Layer::Layer;
  std::string kind() const override { return "global_avgpool"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // gx = g / (H·W) in fp32, rounded to F (recorded as this layer's activation gradient); scale S unchanged.
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  // Output and gradient are rounded to F.
  bool output_in_format(bool) const override { return true; }
  bool input_grads_in_format(bool) const override { return true; }
};

}  // namespace gradscale
