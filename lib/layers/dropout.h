// Dropout (SPEC §5: passes the scale S through unchanged). Training zeroes each value with probability
// p and multiplies the kept ones by 1/(1 − p); that factor is not exact in F in general, so the output
// and the gradient are rounded to F again. Masks come from the caller's seeded generator.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/layers/layer.h"

namespace gradscale {

class Dropout final : public Layer {
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
  // Training with p > 0 rounds output and gradient to F; otherwise they are copies: in F when the input
  // (the output gradient) is — the answer for every mode.
  bool output_in_format(bool in) const override { return in; }
  bool input_grads_in_format(bool out) const override { return out; }

 private:
  double p_;
  float factor_;
  bool masked_ = false;             // whether the last forward applied a mask
  std::vector<std::uint8_t> mask_;  // 1 = kept
};

}  // namespace gradscale
