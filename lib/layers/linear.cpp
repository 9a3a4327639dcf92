// Linear layer (see linear.h). GEMMs are Eigen's blocked float kernels with fp32 accumulation.
#include "lib/layers/linear.h"

#include <algorithm>

#include "lib/layers/precision_ops.h"

namespace gradscale {

Linear::Linear(std::string name, std::int64_t in, std::int64_t out, bool bias, const InitSpec& init, Rng& rng)
    : ParametricLayer(std::move(name), bias), in_(in), out_(out) {
  GS_CHECK_CONFIG(in > 0 && out > 0,
                  "layer '" << name_ << "': in and out must be > 0 (got " << in << ", " << out << ")");
  allocate_parameters(init, rng);
}

Linear::Linear(std::string name, const Options& o)
    : ParametricLayer(std::move(name), o.bias_, o.init_, "Linear::Options"), in_(o.in_), out_(o.out_) {
  GS_CHECK_CONFIG(in_ >= 0, "layer '" << name_ << "': in_features must be > 0 (got " << in_
                                      << "; leave it out to take the input's)");
  GS_CHECK_CONFIG(out_ > 0, "layer '" << name_ << "': Linear::Options needs out_features > 0 (got " << out_ << ")");
}

void Linear::allocate_parameters(const InitSpec& init, Rng& rng) {
  allocate_weight_and_bias({out_, in_}, out_, in_, out_, init, rng);
}

void Linear::infer_input_size(const std::vector<Shape>& inputs) {
  GS_CHECK_SHAPE(inputs.size() == 1 && inputs[0].size() >= 2,
                 "layer '" << name_ << "' (linear) expects input [N, ...], got "
                           << (inputs.empty() ? std::string("none") : shape_string(inputs[0])));
  // A mismatch with a given in_features: output_shape says so.
  if (in_ == 0) in_ = shape_size(inputs[0]) / std::max<std::int64_t>(1, inputs[0][0]);
  GS_CHECK_SHAPE(in_ > 0, "layer '" << name_ << "' (linear) got input " << shape_string(inputs[0])
                                    << " with no features per sample");
}

Shape Linear::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1 && !inputs[0].empty(), "layer '" << name_ << "' takes one input");
  const std::int64_t per_sample = shape_size(inputs[0]) / std::max<std::int64_t>(1, inputs[0][0]);
  GS_CHECK_SHAPE(per_sample == in_, "layer '" << name_ << "' (linear " << in_ << "->" << out_
                                              << ") got input " << shape_string(inputs[0]) << " with "
                                              << per_sample << " features per sample");
  return {inputs[0][0], out_};
}

void Linear::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) {
  const Tensor& x = *inputs[0];
  const std::int64_t n = x.dim(0);
  output.resize(output_shape({x.shape()}));
  auto y = output.matrix(n, out_);
  y.noalias() = x.matrix(n, in_) * weight_work_.matrix(out_, in_).transpose();
  if (has_bias_) y.rowwise() += bias_work_.matrix(1, out_).row(0);
  round_output(output, ctx.precision);
}

void Linear::backward(const std::vector<const Tensor*>& inputs, const Tensor& /*output*/,
                      const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                      BackwardContext& ctx) {
  const Tensor& x = *inputs[0];
  const std::int64_t n = x.dim(0);
  const auto g = grad_output.g.matrix(n, out_);
  const double scale = grad_output.scale;

  // Upstream gradient first (SPEC §5 steps 1–2): o = g·W in fp32, s from the controller, round(s·o).
  if (ScaledGrad* gx = grad_inputs[0]) {
    gx->g.resize(x.shape());
    auto o = gx->g.matrix(n, in_);
    o.noalias() = g * weight_work_.matrix(out_, in_);
    const float* gd = grad_output.g.data();
    const float* wd = weight_work_.data();
    const UpstreamProduct product{weight_work_, out_, [=] { return dense_product_range(gd, n, out_, wd, in_); }};
    scale_upstream_grad(*this, grad_output, product, *gx, ctx);
  }

  // Weight gradients at scale S (step 3).
  grad_w_.resize(weight_.value.shape());
  grad_w_.matrix(out_, in_).noalias() = g.transpose() * x.matrix(n, in_);
  if (has_bias_) {
    grad_b_.resize(bias_.value.shape());
    grad_b_.matrix(1, out_).noalias() = g.colwise().sum();
  }
  accumulate_parameter_grads(scale, ctx);
}

nlohmann::json Linear::describe() const {
  return {{"name", name_}, {"kind", kind()},    {"in", in_},
          {"out", out_},   {"bias", has_bias_}, {"weight_shape", weight_.value.shape()},
          {"K", out_}};
}

}  // namespace gradscale
