// Dropout (see dropout.h). The mask is drawn serially from the caller's generator, so a seed fixes it.
#include "lib/layers/dropout.h"

#include <cmath>
#include <cstring>

#include "lib/core/random.h"
#include "lib/layers/precision_ops.h"

namespace gradscale {

Dropout::Dropout(std::string name, double p)
    : FormatPreservingLayer(std::move(name)), p_(p), factor_(static_cast<float>(1.0 / (1.0 - p))) {
  GS_CHECK_CONFIG(p >= 0 && p < 1, "layer '" << name_ << "': p must be in [0, 1) (got " << p << ")");
}

Shape Dropout::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1, "layer '" << name_ << "' takes one input");
  return inputs[0];
}

void Dropout::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) {
  const Tensor& x = *inputs[0];
  output.resize(output_shape({x.shape()}));
  const std::int64_t n = x.size();
  masked_ = ctx.training && p_ > 0;
  if (!masked_) {
    std::memcpy(output.data(), x.data(), static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  GS_CHECK(ctx.rng != nullptr, "layer '" << name_ << "' (dropout) needs ForwardContext::rng when training");
  mask_.resize(static_cast<std::size_t>(n));
  Rng& rng = *ctx.rng;
  const float* xd = x.data();
  float* yd = output.data();
  for (std::int64_t i = 0; i < n; ++i) {
    const bool keep = uniform01(rng) >= p_;
    mask_[static_cast<std::size_t>(i)] = keep ? 1 : 0;
    yd[i] = keep ? xd[i] * factor_ : 0.0f;
  }
  round_output(output, ctx.precision);
}

void Dropout::backward(const std::vector<const Tensor*>& inputs, const Tensor& /*output*/,
                       const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                       BackwardContext& ctx) {
  ScaledGrad* gx = grad_inputs[0];
  if (!gx) return;
  const Tensor& x = *inputs[0];
  check_dropout_grad(*this, grad_output.g, x, masked_, mask_.size());
  gx->g.resize(x.shape());
  const std::int64_t n = x.size();
  const float* g = grad_output.g.data();
  float* d = gx->g.data();
  if (masked_) {
    for (std::int64_t i = 0; i < n; ++i) d[i] = mask_[static_cast<std::size_t>(i)] ? g[i] * factor_ : 0.0f;
  } else {
    std::memcpy(d, g, static_cast<std::size_t>(n) * sizeof(float));
  }
  send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/masked_);  // 1/(1−p) makes new values
}

void check_dropout_grad(const Layer& layer, const Tensor& grad_output, const Tensor& input, bool masked,
                        std::size_t mask_size) {
  GS_CHECK_SHAPE(grad_output.shape() == input.shape() &&
                     (!masked || mask_size == static_cast<std::size_t>(input.size())),
                 "layer '" << layer.name() << "': output gradient " << shape_string(grad_output.shape())
                           << " does not match input " << shape_string(input.shape()));
}

nlohmann::json Dropout::describe() const {
  return {{"name", name_}, {"kind", kind()}, {"p", p_}};
}

}  // namespace gradscale
