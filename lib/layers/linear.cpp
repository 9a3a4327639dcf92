// Linear layer (see linear.h). GEMMs are Eigen's blocked float kernels with fp32 accumulation.
#include "lib/layers/linear.h"

namespace gradscale {

Linear::Linear(std::string name, std::int64_t in, std::int64_t out, bool bias, const InitSpec& init, Rng& rng)
    : Layer(std::move(name)), in_(in), out_(out), has_bias_(bias) {
  GS_CHECK_CONFIG(in > 0 && out > 0,
                  "layer '" << name_ << "': in and out must be > 0 (got " << in << ", " << out << ")");
  weight_.name = name_ + ".weight";
  weight_.value.reset({out, in}, 0.0f);
  weight_.grad.reset({out, in}, 0.0f);
  init_weights(weight_.value, in, out, init, rng);
  if (has_bias_) {
    bias_.name = name_ + ".bias";
    bias_.value.reset({out}, 0.0f);
    bias_.grad.reset({out}, 0.0f);
    bias_.weight_decay = false;
  }
}

Shape Linear::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1 && !inputs[0].empty(), "layer '" << name_ << "' takes one input");
  const std::int64_t per_sample = shape_size(inputs[0]) / std::max<std::int64_t>(1, inputs[0][0]);
  GS_CHECK_SHAPE(per_sample == in_, "layer '" << name_ << "' (linear " << in_ << "->" << out_
                                              << ") got input " << shape_string(inputs[0]) << " with "
                                              << per_sample << " features per sample");
  return {inputs[0][0], out_};
}

std::vector<Parameter*> Linear::parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

void Linear::prepare_weights(const Precision& p) {
  round_working_copy(weight_, weight_work_, p);
  if (has_bias_) round_working_copy(bias_, bias_work_, p);
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
  accumulate_weight_grad(grad_w_, scale, weight_, id_, ctx.precision, ctx.monitor, ctx.reducer);
  if (has_bias_) {
    grad_b_.resize(bias_.value.shape());
    grad_b_.matrix(1, out_).noalias() = g.colwise().sum();
    accumulate_weight_grad(grad_b_, scale, bias_, id_, ctx.precision, ctx.monitor, ctx.reducer);
  }
}

nlohmann::json Linear::describe() const {
  return {{"name", name_}, {"kind", kind()},    {"in", in_},
          {"out", out_},   {"bias", has_bias_}, {"weight_shape", weight_.value.shape()},
          {"K", out_}};
}

}  // namespace gradscale
