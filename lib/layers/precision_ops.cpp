// The shared steps of the precision model (SPEC §4–§5): rounding activation, joined, weight and loss
// gradients to the gradient format (one function, round_gradient), the found_inf check, the statistics
// taken just before rounding, and the CPU layers' drive of the local-scale step and of the weight-gradient
// factor r (whose rules are written once, in scale_step.cpp). Every layer calls these; none re-implements
// them.
#include "lib/layers/precision_ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "lib/layers/scale_step.h"
#include "lib/scaler/scale_range.h"
#include "lib/scaler/scaler.h"

namespace gradscale {
namespace {

// d ← quantize(src) (src may be d), split over the OpenMP threads in blocks of whole cache lines when the
// tensor is large enough to pay for a parallel region. Rounding is element-wise: the bits do not depend
// on the split. fp32: a copy when src is not d.
void round_into(const float* src, float* d, std::size_t n, Format f, RoundOptions opt) {
  constexpr std::size_t kParallelMin = std::size_t{1} << 16, kAlign = 16;
  if (f == Format::fp32) {  // nothing to round
    if (src != d && n > 0) std::memcpy(d, src, n * sizeof(float));
    return;
  }
  const int threads = omp_get_max_threads();
  if (n < kParallelMin || threads == 1 || omp_in_parallel()) {
    quantize(src, d, n, f, opt);
    return;
  }
  const std::size_t block = (n / static_cast<std::size_t>(threads) + kAlign - 1) / kAlign * kAlign;
#pragma omp parallel num_threads(threads)
  {
    const std::size_t begin = std::min(n, block * static_cast<std::size_t>(omp_get_thread_num()));
    const std::size_t end = std::min(n, begin + block);
    quantize(src + begin, d + begin, end - begin, f, opt);
  }
}

void round_in_place(float* d, std::size_t n, Format f, RoundOptions opt) { round_into(d, d, n, f, opt); }

// d ← s·src in fp32 (src may be d).
void scale_into(const float* src, float* d, std::size_t n, float s) {
  for (std::size_t i = 0; i < n; ++i) d[i] = src[i] * s;
}

TensorStats* stats_slot(StepMonitor& monitor, GradSite site, int node, bool& merge) {
  merge = false;
  if (site == GradSite::loss) {
    monitor.has_loss_grad = true;
    return &monitor.loss_grad;
  }
  LayerRecord& r = monitor.record_of(node);
  switch (site) {
    case GradSite::upstream:
      r.has_activation_grad = true;
      return &r.activation_grad;
    case GradSite::join:
      r.has_joined_grad = true;
      return &r.joined_grad;
    case GradSite::weight:
      merge = r.has_weight_grad;
      r.has_weight_grad = true;
      return &r.weight_grad;
    case GradSite::loss:
      break;
  }
  return nullptr;
}

}  // namespace

void store_gradient_statistics(StepMonitor& monitor, GradSite site, int node, const TensorStats& s) {
  bool merge = false;
  TensorStats* slot = stats_slot(monitor, site, node, merge);
  if (merge)
    slot->merge(s);
  else
    *slot = s;
}

void check_rounded_max(StepMonitor& monitor, GradSite site, int node, float max_abs_before, bool quantized,
                       const Precision& p) {
  // found_inf from the largest magnitude before rounding: rounding is monotone, so the result holds a
  // non-finite value exactly when that maximum is not finite or rounds to the overflow class — which
  // also catches a saturating format (fp8_e4m3) clamping an overflow to a finite value (SPEC §4), at
  // the same threshold tensor_stats counts as overflow.
  const Format f = quantized ? p.gradient_format() : Format::fp32;
  if (std::isfinite(max_abs_before) && (!quantized || classify_rounding(max_abs_before, f, p.round) != RoundClass::overflow))
    return;
  // What is stored: the rounded maximum (a saturating format keeps it finite); anything not finite
  // before rounding counts as stored so (a NaN survives every format).
  const bool stored_nonfinite = !std::isfinite(max_abs_before) || !std::isfinite(quantize(max_abs_before, f, p.round));
  monitor.note_overflow(site, node, max_abs_before, stored_nonfinite);
}

float round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node, const Precision& p,
                     StepMonitor& monitor) {
  return round_gradient(d, d, n, multiplier, site, node, p, monitor);
}

float round_gradient(const float* src, float* d, std::size_t n, float multiplier, GradSite site, int node,
                     const Precision& p, StepMonitor& monitor) {
  const Format f = p.gradient_format();
  const bool quantized = site != GradSite::weight || p.quantize_weight_grads;
  // v: the fp32 values after the multiplier — src itself when there is none, so the rounding's own pass
  // is the one that writes d.
  const float* v = src;
  if (multiplier != 1.0f) {
    scale_into(src, d, n, multiplier);
    v = d;
  }
  if (monitor.record) store_gradient_statistics(monitor, site, node, tensor_stats(v, n, f, p.round));
  // popart_als counts the weight gradients about its edge as they will be stored in F (histogram.h).
  if (site == GradSite::weight && monitor.gradient_edge > 0) {
    const EdgeCounts c = count_about_edge(v, n, static_cast<float>(monitor.gradient_edge),
                                          quantized ? f : Format::fp32, p.round);
    monitor.grad_below_edge += c.below;
    monitor.grad_above_edge += c.above;
  }
  const float m = max_abs(v, n);
  check_rounded_max(monitor, site, node, m, quantized, p);
  round_into(v, d, n, quantized ? f : Format::fp32, p.round);
  return m;
}

void round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor) {
  LayerRecord& r = monitor.record_of(layer_id);
  r.sent_grad = true;
  r.sent_max_abs = round_gradient(t.data(), static_cast<std::size_t>(t.size()), 1.0f, GradSite::upstream,
                                  layer_id, p, monitor);
}

namespace {

// The values before a rounding the observer will see (none without an observer).
std::vector<float> before_rounding(const Tensor& t, const BackwardContext& ctx) {
  if (ctx.observer == nullptr || !t.on_host()) return {};
  return std::vector<float>(t.data(), t.data() + t.size());
}

void observe_upstream(const Layer& layer, const std::vector<float>& before, const ScaledGrad& gx,
                      BackwardContext& ctx) {
  if (ctx.observer != nullptr && gx.g.on_host())
    ctx.observer->upstream(layer.id(), before.data(), gx.g.data(), before.size(), gx.scale);
}

}  // namespace

void send_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, ScaledGrad& gx, BackwardContext& ctx,
                        bool rounds) {
  LayerController* controller = ctx.scaler.layer_controller();
  if (controller == nullptr || !controller->acts_at(layer.id())) {  // the paper's rule: S passes on
    const std::vector<float> before = before_rounding(gx.g, ctx);
    if (rounds) round_activation_grad(gx.g, layer.id(), ctx.precision, ctx.monitor);
    gx.scale = grad_output.scale;
    observe_upstream(layer, before, gx, ctx);
    return;
  }
  static const Tensor kNoWeight;
  scale_upstream_grad(layer, grad_output, UpstreamProduct{kNoWeight, 0, nullptr}, gx, ctx);
}

void round_output(Tensor& t, const Precision& p) {
  round_in_place(t.data(), static_cast<std::size_t>(t.size()), p.format, p.round);
}

void round_working_copy(const Parameter& master, Tensor& working, const Precision& p) {
  working.resize(master.value.shape());
  quantize(master.value.data(), working.data(), static_cast<std::size_t>(master.value.size()), p.format,
           p.round);
}

void note_backward(int layer_id, double scale_in, StepMonitor& monitor) {
  LayerRecord& r = monitor.record_of(layer_id);
  r.ran = true;
  r.scale_in = r.scale_out = scale_in;
}

void check_output_grad(const Layer& layer, const Tensor& grad_output, const Tensor& output) {
  GS_CHECK_SHAPE(grad_output.shape() == output.shape(),
                 "layer '" << layer.name() << "': output gradient " << shape_string(grad_output.shape())
                           << " does not match output " << shape_string(output.shape()));
}

void QueryStatistics::attach(StatNeeds needs, LocalScaleQuery& q, RoundOptions round,
                             const std::function<ProductRange()>& product_range) {
  const auto grad_n = static_cast<std::size_t>(q.grad_size);
  if (needs & kNeedGradMoments) {
    grad_moments = tensor_moments(q.grad, grad_n);
    q.grad_moments = &grad_moments;
  }
  if (needs & kNeedGradLogMoments) {
    grad_log_moments = log_abs_moments(q.grad, grad_n);
    q.grad_log_moments = &grad_log_moments;
  }
  if ((needs & kNeedWeightMoments) && q.weight) {
    weight_moments = tensor_moments(q.weight, static_cast<std::size_t>(q.weight_size));
    q.weight_moments = &weight_moments;
  }
  if ((needs & kNeedUpstreamStats) && q.upstream) {
    upstream_stats = tensor_stats(q.upstream, static_cast<std::size_t>(q.upstream_size), q.format, round);
    q.upstream_stats = &upstream_stats;
  }
  if ((needs & kNeedProductRange) && product_range) {
    products = product_range();
    q.products = &products;
  }
}

LocalScaleQuery upstream_query(const Layer& layer, const ScaledGrad& grad_output, const UpstreamProduct& product,
                               const Tensor& upstream, const BackwardContext& ctx) {
  LocalScaleQuery q = upstream_query(layer.id(), layer.name(), ctx.step, ctx.precision.gradient_format(),
                                     grad_output.scale, product.reduction, grad_output.g.shape(),
                                     product.weight.shape(), upstream.shape());
  if (upstream.on_host()) {  // raw views of host memory only
    q.grad = grad_output.g.data();
    q.weight = product.weight.size() > 0 ? product.weight.data() : nullptr;  // none without a GEMM
    q.upstream = upstream.data();
  }
  return q;
}

void scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, const UpstreamProduct& product,
                         ScaledGrad& gx, BackwardContext& ctx) {
  LocalScale decision;  // s = 1 under a global policy
  if (LayerController* controller = ctx.scaler.layer_controller()) {
    const auto t0 = std::chrono::steady_clock::now();
    decision = decide_local_scale(
        *controller, upstream_query(layer, grad_output, product, gx.g, ctx),
        [&](StatNeeds needs, QueryStatistics& stats, LocalScaleQuery& q) {
          stats.attach(needs, q, ctx.precision.round, product.product_range);
        },
        ctx.reducer, ctx.scaler.policy(), ctx.monitor, t0);
  }
  std::vector<float> before = before_rounding(gx.g, ctx);
  for (float& v : before) v *= static_cast<float>(decision.s);  // what is rounded: s·g (exact for a power of two)
  gx.scale = send_at_local_scale(ctx.monitor, layer.id(), decision, grad_output.scale, [&](float s) {
    ctx.monitor.record_of(layer.id()).sent_max_abs =
        round_gradient(gx.g.data(), static_cast<std::size_t>(gx.g.size()), s, GradSite::upstream, layer.id(),
                       ctx.precision, ctx.monitor);
  });
  observe_upstream(layer, before, gx, ctx);
}

void accumulate_weight_grad(Tensor& g, double scale, Parameter& param, int layer_id, const Precision& p,
                            StepMonitor& monitor, double factor, StatisticsReducer* reducer) {
  GS_CHECK_SHAPE(g.size() == param.grad.size(),
                 "gradient of " << param.name << " has shape " << shape_string(g.shape())
                                << ", parameter has " << shape_string(param.grad.shape()));
  const auto n = static_cast<std::size_t>(g.size());
  if (reducer) reducer->reduce_sum(g.data(), n);  // data-parallel: the whole batch's, rounded once below
  round_gradient(g.data(), n, static_cast<float>(factor), GradSite::weight, layer_id, p, monitor);
  // An accumulated scale outside float32's range cannot be divided out (0·inf, or a gradient wiped to
  // 0): the step counts as non-finite, so the scaler skips it and nothing of it is applied.
  const double stored_at = factor * scale;
  if (!scale_in_float_range(stored_at)) {
    monitor.note_nonfinite(layer_id);
    return;
  }
  // Unscale in fp32 (SPEC §4): master grad += g / (r·S) (exact for power-of-two r and S).
  const auto s = static_cast<float>(stored_at);
  float* dst = param.grad.data();
  const float* src = g.data();
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i] / s;
}

void accumulate_weight_grads(const Layer& layer, std::initializer_list<WeightGrad> grads, double scale,
                             BackwardContext& ctx) {
  // r needs each gradient's maximum: taken only when a controller chooses r for rounded weight gradients.
  LayerController* controller = weight_grad_controller(ctx.scaler, ctx.precision);
  LayerRecord& record = ctx.monitor.record_of(layer.id());
  record.weight_grad_scale = 1.0;
  bool first = true;
  for (const WeightGrad& w : grads) {
    // Data-parallel: the whole batch's gradient, so every rank takes the same r from the same maximum.
    if (ctx.reducer) ctx.reducer->reduce_sum(w.grad->data(), static_cast<std::size_t>(w.grad->size()));
    const double r =
        controller == nullptr
            ? 1.0
            : checked_weight_grad_scale(
                  *controller, layer.id(), layer.name(), ctx.step, ctx.precision.gradient_format(), scale,
                  max_abs(w.grad->data(), static_cast<std::size_t>(w.grad->size())), ctx.scaler.policy());
    keep_smallest_weight_grad_scale(record, r, first);
    first = false;
    std::vector<float> before = before_rounding(*w.grad, ctx);
    for (float& v : before) v *= static_cast<float>(r);  // what is rounded: r·g
    accumulate_weight_grad(*w.grad, scale, *w.param, layer.id(), ctx.precision, ctx.monitor, r);
    if (ctx.observer != nullptr && w.grad->on_host())
      ctx.observer->weight(layer.id(), before.data(), w.grad->data(), before.size(), r * scale);
  }
}

}  // namespace gradscale
