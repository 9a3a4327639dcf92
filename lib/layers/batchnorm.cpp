// BatchNorm (see batchnorm.h). Sums over a channel run in double; channels (statistics) and planes
// (elementwise passes) are split statically over OpenMP threads, so results do not depend on threads.
#include "lib/layers/batchnorm.h"

#include <cmath>

#include "lib/layers/precision_ops.h"

namespace gradscale {

BatchNorm::BatchNorm(std::string name, std::int64_t channels, double eps, double momentum)
    : Layer(std::move(name)), channels_(channels), eps_(eps), momentum_(momentum) {
  GS_CHECK_CONFIG(channels > 0, "layer '" << name_ << "': channels must be > 0 (got " << channels << ")");
  check_settings();
  allocate(channels);
}

BatchNorm::BatchNorm(std::string name, const Options& o)
    : Layer(std::move(name)), channels_(o.channels_), eps_(o.eps_), momentum_(o.momentum_) {
  GS_CHECK_CONFIG(channels_ >= 0, "layer '" << name_ << "': channels must be > 0 (got " << channels_
                                            << "; leave it out to take the input's)");
  check_settings();
  if (channels_ > 0) allocate(channels_);
}

void BatchNorm::check_settings() const {
  GS_CHECK_CONFIG(std::isfinite(eps_) && eps_ > 0,
                  "layer '" << name_ << "': eps must be > 0 (got " << eps_ << ")");
  GS_CHECK_CONFIG(momentum_ >= 0 && momentum_ <= 1,
                  "layer '" << name_ << "': momentum must be in [0, 1] (got " << momentum_ << ")");
}

void BatchNorm::allocate(std::int64_t channels) {
  channels_ = channels;
  gamma_.name = name_ + ".weight";
  gamma_.value.reset({channels}, 1.0f);
  gamma_.grad.reset({channels}, 0.0f);
  gamma_.weight_decay = false;
  beta_.name = name_ + ".bias";
  beta_.value.reset({channels}, 0.0f);
  beta_.grad.reset({channels}, 0.0f);
  beta_.weight_decay = false;
  running_mean_.reset({channels}, 0.0f);
  running_var_.reset({channels}, 1.0f);
}

void BatchNorm::infer_sizes(const std::vector<Shape>& inputs, Rng* /*init_rng*/) {
  if (channels_ > 0) return;  // given, or taken at an earlier finalize
  GS_CHECK_SHAPE(inputs.size() == 1 && (inputs[0].size() == 2 || inputs[0].size() == 4) && inputs[0][1] > 0,
                 "layer '" << name_ << "' (batchnorm) expects input [N, C] or [N, C, H, W], got "
                           << (inputs.empty() ? std::string("none") : shape_string(inputs[0])));
  allocate(inputs[0][1]);
}

Shape BatchNorm::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1, "layer '" << name_ << "' takes one input");
  const Shape& s = inputs[0];
  GS_CHECK_SHAPE((s.size() == 2 || s.size() == 4) && s[1] == channels_,
                 "layer '" << name_ << "' (batchnorm " << channels_ << ") expects input [N, " << channels_
                           << "] or [N, " << channels_ << ", H, W], got " << shape_string(s));
  return s;
}

BatchNorm::Layout BatchNorm::layout(const Shape& s) const {
  return {s[0], s.size() == 4 ? s[2] * s[3] : 1};
}

void BatchNorm::prepare_weights(const Precision& p) {
  round_working_copy(gamma_, gamma_work_, p);
  round_working_copy(beta_, beta_work_, p);
}

std::vector<std::pair<std::string, Tensor*>> BatchNorm::buffers() {
  return {{name_ + ".running_mean", &running_mean_}, {name_ + ".running_var", &running_var_}};
}

void BatchNorm::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) {
  const Tensor& x = *inputs[0];
  output.resize(output_shape({x.shape()}));
  GS_CHECK(gamma_work_.size() == channels_, "layer '" << name_ << "': prepare_weights() was not called");
  const Layout l = layout(x.shape());
  const std::int64_t count = l.n * l.plane, c_stride = channels_ * l.plane;
  const float* xd = x.data();
  mean_.resize(static_cast<std::size_t>(channels_));
  invstd_.resize(static_cast<std::size_t>(channels_));
  last_training_ = ctx.training;
  if (ctx.training) {
    GS_CHECK_SHAPE(count > 1, "layer '" << name_
                                        << "': training needs more than one value per channel, got input "
                                        << shape_string(x.shape()));
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < channels_; ++c) {
      double sum = 0;
      for (std::int64_t n = 0; n < l.n; ++n) {
        const float* p = xd + n * c_stride + c * l.plane;
        for (std::int64_t i = 0; i < l.plane; ++i) sum += p[i];
      }
      const double mean = sum / static_cast<double>(count);
      double ss = 0;  // two passes: no cancellation when |mean| >> std
      for (std::int64_t n = 0; n < l.n; ++n) {
        const float* p = xd + n * c_stride + c * l.plane;
        for (std::int64_t i = 0; i < l.plane; ++i) ss += (p[i] - mean) * (p[i] - mean);
      }
      const double var = ss / static_cast<double>(count);
      const auto ci = static_cast<std::size_t>(c);
      mean_[ci] = mean;
      invstd_[ci] = 1.0 / std::sqrt(var + eps_);
      const double unbiased = ss / static_cast<double>(count - 1);
      running_mean_[c] = static_cast<float>((1 - momentum_) * running_mean_[c] + momentum_ * mean);
      running_var_[c] = static_cast<float>((1 - momentum_) * running_var_[c] + momentum_ * unbiased);
    }
  } else {
    for (std::int64_t c = 0; c < channels_; ++c) {
      mean_[static_cast<std::size_t>(c)] = running_mean_[c];
      invstd_[static_cast<std::size_t>(c)] = 1.0 / std::sqrt(static_cast<double>(running_var_[c]) + eps_);
    }
  }

  // y = γ·(x − mean)·invstd + β in double, one rounding to fp32, then to F.
  float* yd = output.data();
  const std::int64_t planes = l.n * channels_;
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    const auto c = static_cast<std::size_t>(p % channels_);
    const double a = gamma_work_[p % channels_] * invstd_[c], m = mean_[c], b = beta_work_[p % channels_];
    for (std::int64_t i = p * l.plane; i < (p + 1) * l.plane; ++i)
      yd[i] = static_cast<float>((xd[i] - m) * a + b);
  }
  round_output(output, ctx.precision);
}

void BatchNorm::backward(const std::vector<const Tensor*>& inputs, const Tensor& /*output*/,
                         const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                         BackwardContext& ctx) {
  const Tensor& x = *inputs[0];
  GS_CHECK_SHAPE(grad_output.g.shape() == x.shape() && mean_.size() == static_cast<std::size_t>(channels_),
                 "layer '" << name_ << "': output gradient " << shape_string(grad_output.g.shape())
                           << " does not match input " << shape_string(x.shape()));
  const Layout l = layout(x.shape());
  const std::int64_t count = l.n * l.plane, c_stride = channels_ * l.plane;
  const float* xd = x.data();
  const float* gd = grad_output.g.data();
  const double scale = grad_output.scale;

  // dβ = Σ g, dγ = Σ g·x̂ per channel, at scale S.
  grad_gamma_.resize(gamma_.value.shape());
  grad_beta_.resize(beta_.value.shape());
  sum_g_.resize(static_cast<std::size_t>(channels_));
  sum_gx_.resize(static_cast<std::size_t>(channels_));
  double* sum_g = sum_g_.data();
  double* sum_gx = sum_gx_.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < channels_; ++c) {
    const auto ci = static_cast<std::size_t>(c);
    double sg = 0, sgx = 0;
    for (std::int64_t n = 0; n < l.n; ++n) {
      const std::int64_t off = n * c_stride + c * l.plane;
      for (std::int64_t i = off; i < off + l.plane; ++i) {
        sg += gd[i];
        sgx += gd[i] * (xd[i] - mean_[ci]) * invstd_[ci];
      }
    }
    sum_g[ci] = sg;
    sum_gx[ci] = sgx;
    grad_beta_[c] = static_cast<float>(sg);
    grad_gamma_[c] = static_cast<float>(sgx);
  }

  // Training: gx = γ·invstd·(g − Σg/M − x̂·Σ(g·x̂)/M); eval: gx = γ·invstd·g. Linear in g: scale S kept.
  if (ScaledGrad* gx = grad_inputs[0]) {
    gx->g.resize(x.shape());
    float* d = gx->g.data();
    const std::int64_t planes = l.n * channels_;
    const double inv_count = last_training_ ? 1.0 / static_cast<double>(count) : 0.0;
#pragma omp parallel for schedule(static)
    for (std::int64_t p = 0; p < planes; ++p) {
      const auto c = static_cast<std::size_t>(p % channels_);
      const double a = gamma_work_[p % channels_] * invstd_[c], m = mean_[c], is = invstd_[c];
      const double mg = sum_g[c] * inv_count, mgx = sum_gx[c] * inv_count;
      for (std::int64_t i = p * l.plane; i < (p + 1) * l.plane; ++i)
        d[i] = static_cast<float>(a * (gd[i] - mg - (xd[i] - m) * is * mgx));
    }
    send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/true);
  }
  accumulate_weight_grads(*this, {{&grad_gamma_, &gamma_}, {&grad_beta_, &beta_}}, scale, ctx);
}

// The layer table lists γ and β under "parameters" (they train, and their gradients are traced as
// "wgrad"); the running statistics are not trained, so they are named apart, under "statistics".
nlohmann::json BatchNorm::describe() const {
  const std::vector<std::int64_t> shape = {channels_};
  return {{"name", name_},
          {"kind", kind()},
          {"channels", channels_},
          {"eps", eps_},
          {"momentum", momentum_},
          {"statistics",
           {{{"name", name_ + ".running_mean"}, {"shape", shape}},
            {{"name", name_ + ".running_var"}, {"shape", shape}}}}};
}

}  // namespace gradscale
