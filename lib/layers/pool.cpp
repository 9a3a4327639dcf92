// MaxPool2d and GlobalAvgPool (see pool.h). Both work plane by plane ([N·C] planes of H×W), split
// statically over OpenMP threads; every plane is independent, so the result does not depend on threads.
#include "lib/layers/pool.h"

#include <algorithm>
#include <limits>

#include "lib/layers/precision_ops.h"

namespace gradscale {

namespace {

// Whether v replaces the running maximum `best` of a window visited in row-major order: a larger value,
// or the first NaN (NaN != NaN is the branch-free isnan).
inline bool takes_over(float v, float best) {
  return v > best || (v != v && best == best);
}

// The common 2×2, stride-2 window: the same rule as the generic loop, written without branches over
// two input rows at a time so the compiler can vectorise it.
void max_pool_2x2(const float* xd, std::int64_t planes, std::int64_t h, std::int64_t w, float* yd,
                  std::int32_t* idx) {
  const std::int64_t ho = h / 2, wo = w / 2;
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* in = xd + p * h * w;
    for (std::int64_t oh = 0; oh < ho; ++oh) {
      const float* r0 = in + 2 * oh * w;
      const float* r1 = r0 + w;
      float* y = yd + (p * ho + oh) * wo;
      std::int32_t* id = idx + (p * ho + oh) * wo;
      const auto base = static_cast<std::int32_t>(2 * oh * w);
      const auto down = static_cast<std::int32_t>(w);
      for (std::int64_t ow = 0; ow < wo; ++ow) {
        const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        const auto col = base + static_cast<std::int32_t>(2 * ow);
        float best = a;
        std::int32_t at = col;
        const bool tb = takes_over(b, best);
        best = tb ? b : best;
        at = tb ? col + 1 : at;
        const bool tc = takes_over(c, best);
        best = tc ? c : best;
        at = tc ? col + down : at;
        const bool td = takes_over(d, best);
        best = td ? d : best;
        at = td ? col + down + 1 : at;
        y[ow] = best;
        id[ow] = at;
      }
    }
  }
}

}  // namespace

MaxPool2d::MaxPool2d(std::string name, std::int64_t kernel, std::int64_t stride)
    : FormatPreservingLayer(std::move(name)), kernel_(kernel), stride_(stride == 0 ? kernel : stride) {
  GS_CHECK_CONFIG(kernel > 0, "layer '" << name_ << "': kernel must be > 0 (got " << kernel << ")");
  GS_CHECK_CONFIG(stride >= 0, "layer '" << name_ << "': stride must be > 0, or 0 for stride = kernel (got "
                                         << stride << ")");
}

Shape MaxPool2d::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1, "layer '" << name_ << "' takes one input");
  const Shape& s = inputs[0];
  GS_CHECK_SHAPE(s.size() == 4 && s[2] >= kernel_ && s[3] >= kernel_,
                 "layer '" << name_ << "' (maxpool " << kernel_ << "x" << kernel_
                           << ") expects input [N, C, H, W] with H, W >= " << kernel_ << ", got "
                           << shape_string(s));
  GS_CHECK_SHAPE(s[2] * s[3] <= std::numeric_limits<std::int32_t>::max(),
                 "layer '" << name_ << "': plane of input " << shape_string(s) << " is too large");
  return {s[0], s[1], (s[2] - kernel_) / stride_ + 1, (s[3] - kernel_) / stride_ + 1};
}

void MaxPool2d::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) {
  const Tensor& x = *inputs[0];
  output.resize(output_shape({x.shape()}));
  const std::int64_t h = x.dim(2), w = x.dim(3), ho = output.dim(2), wo = output.dim(3);
  const std::int64_t planes = x.dim(0) * x.dim(1);
  argmax_.resize(static_cast<std::size_t>(output.size()));
  const float* xd = x.data();
  float* yd = output.data();
  std::int32_t* idx = argmax_.data();
  if (kernel_ == 2 && stride_ == 2) {
    max_pool_2x2(xd, planes, h, w, yd, idx);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* in = xd + p * h * w;
    for (std::int64_t oh = 0; oh < ho; ++oh) {
      for (std::int64_t ow = 0; ow < wo; ++ow) {
        std::int64_t best_i = oh * stride_ * w + ow * stride_;
        float best = in[best_i];
        for (std::int64_t ki = 0; ki < kernel_; ++ki) {
          for (std::int64_t kj = 0; kj < kernel_; ++kj) {
            const std::int64_t i = (oh * stride_ + ki) * w + ow * stride_ + kj;
            const float v = in[i];
            if (takes_over(v, best)) {
              best = v;
              best_i = i;
            }
          }
        }
        const std::int64_t o = (p * ho + oh) * wo + ow;
        yd[o] = best;
        idx[o] = static_cast<std::int32_t>(best_i);
      }
    }
  }
}

void MaxPool2d::backward(const std::vector<const Tensor*>& inputs, const Tensor& output,
                         const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                         BackwardContext& ctx) {
  ScaledGrad* gx = grad_inputs[0];
  if (!gx) return;
  const Tensor& x = *inputs[0];
  check_max_pool_grad(*this, grad_output.g, output, argmax_.size());
  gx->g.resize(x.shape());
  const std::int64_t plane_in = x.dim(2) * x.dim(3), plane_out = output.dim(2) * output.dim(3);
  const std::int64_t planes = x.dim(0) * x.dim(1);
  const float* g = grad_output.g.data();
  const std::int32_t* idx = argmax_.data();
  float* d = gx->g.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    float* dp = d + p * plane_in;
    std::fill(dp, dp + plane_in, 0.0f);
    for (std::int64_t o = p * plane_out; o < (p + 1) * plane_out; ++o) dp[idx[o]] += g[o];
  }
  send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/stride_ < kernel_);  // overlapping windows add
}

void check_max_pool_grad(const Layer& layer, const Tensor& grad_output, const Tensor& output,
                         std::size_t argmax_size) {
  GS_CHECK_SHAPE(
      grad_output.shape() == output.shape() && argmax_size == static_cast<std::size_t>(output.size()),
      "layer '" << layer.name() << "': output gradient " << shape_string(grad_output.shape())
                << " does not match the last forward's output " << shape_string(output.shape()));
}

nlohmann::json MaxPool2d::describe() const {
  return {{"name", name_}, {"kind", kind()}, {"kernel", kernel_}, {"stride", stride_}};
}

Shape GlobalAvgPool::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1, "layer '" << name_ << "' takes one input");
  const Shape& s = inputs[0];
  GS_CHECK_SHAPE(s.size() == 4 && s[2] * s[3] > 0,
                 "layer '" << name_ << "' (global_avgpool) expects input [N, C, H, W] "
                           << "with H·W > 0, got " << shape_string(s));
  return {s[0], s[1]};
}

void GlobalAvgPool::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) {
  const Tensor& x = *inputs[0];
  output.resize(output_shape({x.shape()}));
  const std::int64_t plane = x.dim(2) * x.dim(3), planes = output.size();
  const float* xd = x.data();
  float* yd = output.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    double sum = 0;
    for (std::int64_t i = p * plane; i < (p + 1) * plane; ++i) sum += xd[i];
    yd[p] = static_cast<float>(sum / static_cast<double>(plane));
  }
  round_output(output, ctx.precision);
}

void GlobalAvgPool::backward(const std::vector<const Tensor*>& inputs, const Tensor& output,
                             const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                             BackwardContext& ctx) {
  ScaledGrad* gx = grad_inputs[0];
  if (!gx) return;
  const Tensor& x = *inputs[0];
  check_output_grad(*this, grad_output.g, output);
  gx->g.resize(x.shape());
  const std::int64_t plane = x.dim(2) * x.dim(3), planes = output.size();
  const auto count = static_cast<float>(plane);
  const float* g = grad_output.g.data();
  float* d = gx->g.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) std::fill(d + p * plane, d + (p + 1) * plane, g[p] / count);
  send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/true);
}

}  // namespace gradscale
