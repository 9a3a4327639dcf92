// ReLU and Flatten (see relu.h): no rounding needed, the values stay in F.
#include "lib/layers/relu.h"

#include <algorithm>
#include <cstring>

#include "lib/layers/precision_ops.h"

namespace gradscale {

namespace {

// Below this many elements a loop stays on one thread (a parallel region costs a few microseconds).
constexpr std::int64_t kParallelMin = std::int64_t{1} << 15;

}  // namespace

Shape ReLU::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1, "layer '" << name_ << "' takes one input");
  return inputs[0];
}

void ReLU::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) {
  const Tensor& x = *inputs[0];
  output.resize(x.shape());
  const float* in = x.data();
  float* out = output.data();
  const std::int64_t n = x.size();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] < 0.0f ? 0.0f : in[i];  // std::max(x, 0): NaN passes
}

void ReLU::backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                    const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) {
  ScaledGrad* gx = grad_inputs[0];
  if (!gx) return;
  gx->g.resize(output.shape());
  const float* y = output.data();
  const float* g = grad_output.g.data();
  float* d = gx->g.data();
  const std::int64_t n = output.size();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) d[i] = y[i] > 0.0f ? g[i] : 0.0f;
  send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/false);
}

Shape Flatten::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1 && !inputs[0].empty(), "layer '" << name_ << "' takes one input");
  const std::int64_t n = inputs[0][0];
  return {n, n ? shape_size(inputs[0]) / n : 0};
}

void Flatten::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) {
  const Tensor& x = *inputs[0];
  output.resize(output_shape({x.shape()}));
  std::memcpy(output.data(), x.data(), static_cast<std::size_t>(x.size()) * sizeof(float));
}

void Flatten::backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                       const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) {
  ScaledGrad* gx = grad_inputs[0];
  if (!gx) return;
  gx->g.resize(inputs[0]->shape());
  std::memcpy(gx->g.data(), grad_output.g.data(),
              static_cast<std::size_t>(grad_output.g.size()) * sizeof(float));
  send_upstream_grad(*this, grad_output, *gx, ctx, /*rounds=*/false);
}

}  // namespace gradscale
