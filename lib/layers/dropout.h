// Dropout (SPEC §5: passes the scale S through unchanged). Training zeroes each value with probability
// p and multiplies the kept ones by 1/(1 − p); that factor is not exact in F in general, so the output
// and the gradient are rounded to F again. Masks come from the caller's seeded generator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/layers/format_preserving_layer.h"

namespace gradscale {

// Output and input gradient are in F when the input and the output gradient are, in every mode
// (FormatPreservingLayer): training with p > 0 rounds them to F, otherwise they are copies.
class Dropout final : public FormatPreservingLayer {
 public:
  // 0 <= p < 1.
  Dropout(std::string name, double p);

  std::string kind() const override { return "dropout"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  // Training (p > 0): one uniform01 draw from *ctx.rng per element (required), kept where draw >= p,
  // y = round(x·f) with f = float(1/(1 − p)). Eval or p = 0: y = x.
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // The mask and factor of the last forward: gx = round(g·f) where kept, else 0; scale S unchanged.
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  nlohmann::json describe() const override;

 private:
  double p_;
  float factor_;
  bool masked_ = false;             // whether the last forward applied a mask
  std::vector<std::uint8_t> mask_;  // 1 = kept
};

// Dropout's backward check, shared with its CUDA twin: ShapeError naming `layer` unless the output
// gradient has the input's shape and, when the last forward applied a mask (`masked`), that mask has one
// entry per element (`mask_size`).
void check_dropout_grad(const Layer& layer, const Tensor& grad_output, const Tensor& input, bool masked,
                        std::size_t mask_size);

}  // namespace gradscale
