// The shared steps of the precision model (SPEC §4): rounding activation gradients and weight
// gradients to F, the found_inf check, and the statistics taken just before rounding. Every layer
// calls these; none re-implements them.

#include <omp.h>

#include <algorithm>

#include "lib/instrument/edge_count.h"
#include "lib/layers/layer.h"
#include "lib/scaler/scaler.h"

namespace gradscale {

void StepMonitor::reset(int num_layers, bool record_stats, double edge) {
  found_inf = false;
  first_nonfinite_layer = -1;
  record = record_stats;
  gradient_edge = edge;
  grad_below_edge = grad_above_edge = 0;
  records.assign(static_cast<std::size_t>(num_layers), LayerRecord{});
  for (int i = 0; i < num_layers; ++i) records[static_cast<std::size_t>(i)].layer_id = i;
}

void StepMonitor::note_nonfinite(int layer_id) {
  if (!found_inf) first_nonfinite_layer = layer_id;
  found_inf = true;
}

LayerRecord& StepMonitor::record_of(int layer_id) {
  GS_CHECK(layer_id >= 0 && static_cast<std::size_t>(layer_id) < records.size(),
           "layer id " << layer_id << " outside the monitor's " << records.size() << " layers");
  return records[static_cast<std::size_t>(layer_id)];
}

namespace {

// quantize() in place, split over the OpenMP threads in blocks of whole cache lines when the tensor is
// large enough to pay for a parallel region. Rounding is element-wise: the bits do not depend on the split.
void round_in_place(float* d, std::size_t n, const Precision& p) {
  constexpr std::size_t kParallelMin = std::size_t{1} << 16, kAlign = 16;
  if (p.format == Format::fp32) return;  // nothing to round
  const int threads = omp_get_max_threads();
  if (n < kParallelMin || threads == 1 || omp_in_parallel()) {
    quantize(d, d, n, p.format, p.round);
    return;
  }
  const std::size_t block = (n / static_cast<std::size_t>(threads) + kAlign - 1) / kAlign * kAlign;
#pragma omp parallel num_threads(threads)
  {
    const std::size_t begin = std::min(n, block * static_cast<std::size_t>(omp_get_thread_num()));
    const std::size_t end = std::min(n, begin + block);
    quantize(d + begin, d + begin, end - begin, p.format, p.round);
  }
}

}  // namespace

void round_output(Tensor& t, const Precision& p) {
  round_in_place(t.data(), static_cast<std::size_t>(t.size()), p);
}

void round_working_copy(const Parameter& master, Tensor& working, const Precision& p) {
  working.resize(master.value.shape());
  quantize(master.value.data(), working.data(), static_cast<std::size_t>(master.value.size()), p.format,
           p.round);
}

void scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, const Tensor& weight_working,
                         ScaledGrad& gx, BackwardContext& ctx) {
  LocalScaleQuery q;
  q.layer_id = layer.id();
  q.layer_name = layer.name();
  q.format = ctx.precision.format;
  q.scale_in = grad_output.scale;
  q.grad = grad_output.g.data();
  q.grad_size = grad_output.g.size();
  q.weight = weight_working.data();
  q.weight_size = weight_working.size();
  q.reduction = layer.reduction_length();
  q.upstream = gx.g.data();
  q.upstream_size = gx.g.size();
  const double s = ctx.scaler.local_scale(q);
  // s multiplies the fp32 accumulator before the one rounding, so s·g itself never overflows.
  if (s != 1.0) {
    const auto sf = static_cast<float>(s);
    float* d = gx.g.data();
    for (std::int64_t i = 0; i < gx.g.size(); ++i) d[i] *= sf;
  }
  ctx.monitor.record_of(layer.id()).local_scale = s;
  round_activation_grad(gx.g, layer.id(), ctx.precision, ctx.monitor);
  gx.scale = s * grad_output.scale;
}

void round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor) {
  const auto n = static_cast<std::size_t>(t.size());
  if (monitor.record) {
    LayerRecord& r = monitor.record_of(layer_id);
    r.activation_grad = tensor_stats(t.data(), n, p.format, p.round);
    r.has_activation_grad = true;
  }
  round_in_place(t.data(), n, p);
  if (!all_finite(t.data(), n)) monitor.note_nonfinite(layer_id);
}

void accumulate_weight_grad(Tensor& g, double scale, Parameter& param, int layer_id, const Precision& p,
                            StepMonitor& monitor) {
  GS_CHECK_SHAPE(g.size() == param.grad.size(),
                 "gradient of " << param.name << " has shape " << shape_string(g.shape())
                                << ", parameter has " << shape_string(param.grad.shape()));
  const auto n = static_cast<std::size_t>(g.size());
  if (monitor.record) {
    LayerRecord& r = monitor.record_of(layer_id);
    const TensorStats s = tensor_stats(g.data(), n, p.format, p.round);
    if (r.has_weight_grad)
      r.weight_grad.merge(s);
    else
      r.weight_grad = s;
    r.has_weight_grad = true;
  }
  if (p.quantize_weight_grads) quantize(g.data(), g.data(), n, p.format, p.round);
  if (!all_finite(g.data(), n)) monitor.note_nonfinite(layer_id);
  if (monitor.gradient_edge > 0) {
    const EdgeCounts c = count_about_edge(g.data(), n, static_cast<float>(monitor.gradient_edge));
    monitor.grad_below_edge += c.below;
    monitor.grad_above_edge += c.above;
  }
  // Unscale in fp32 (SPEC §4): master grad += g / S (exact for power-of-two S).
  const auto s = static_cast<float>(scale);
  float* dst = param.grad.data();
  const float* src = g.data();
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i] / s;
}

}  // namespace gradscale
