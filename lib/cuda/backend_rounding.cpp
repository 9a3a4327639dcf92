// The CUDA backend's precision steps (see backend.h; SPEC §4–§5): the gradient rounding and its queued
// measurement, the local-scale step of a parametric layer (decided on the device, or on the host through
// lib/layers/scale_step.h as the CPU layers are), and the weight gradients' factor r and unscale.
#include "lib/cuda/backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>
#include "lib/cuda/elementwise.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/unscale.h"
#include "lib/layers/scale_step.h"
#include "lib/scaler/scale_range.h"
#include "lib/scaler/scaler.h"

namespace gradscale::cuda {

void CudaBackend::round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node,
                                 const Precision& p, StepMonitor& monitor, const DeviceScale* factor,
                                 const UnscaleJob* unscale, const WeightGradDecision* decides_r) {
  const Format f = p.gradient_format();
  const bool quantized = site != GradSite::weight || p.quantize_weight_grads;
  const bool edge = site == GradSite::weight && monitor.gradient_edge > 0;  // popart_als: added up in the header
  cudaStream_t stream = ctx_.stream();
  const StatsJob job{d, n, f, p.round};
  DeviceStats* slot = next_slot();  // the slot of the record pushed next
  pending_.push_back(Pending{site, node, quantized, p});
  GS_CHECK(unscale == nullptr || unscale->grad == d, "CudaBackend::round_gradient: the unscale reads another array");
  if (!edge) {  // the multiplication, the statistics, the rounding (and the unscale) in one pass
    StoredRounding stored{d, quantized, multiplier, factor ? &factor->local : nullptr};
    if (unscale != nullptr) {
      stored.master = unscale->master;
      stored.scale = unscale->scale;
      stored.device_scale = unscale->scale_on_device;
      stored.found_inf = found_inf_.data();
    }
    stored.decides_r = decides_r;
    measure_and_round(ctx_, job, stored, slot);
    return;
  }
  if (decides_r != nullptr)  // r from d's own statistics first, as the one pass decides it
    tensor_stats(ctx_, &job, 1, query_stats_.data(),
                 StatsDecision::weight_grad_scale(decides_r->u_max, decides_r->in, decides_r->out));
  if (factor != nullptr)
    apply_local_scale(d, n, factor, stream);
  else if (multiplier != 1.0f)
    quantize(d, d, n, Format::fp32, p.round, multiplier, stream);  // fp32: d·multiplier
  tensor_stats(ctx_, &job, 1, slot);
  if (!edge_counting_) {
    GS_CUDA_CHECK(cudaMemsetAsync(&header()->edge, 0, sizeof(DeviceEdgeCounts), stream));
    edge_counting_ = true;
  }
  const std::uint32_t t =
      edge_threshold_bits(static_cast<float>(monitor.gradient_edge), quantized ? f : Format::fp32, p.round);
  count_about_edge(d, n, t, &header()->edge, stream);
  if (quantized) quantize(d, d, n, f, p.round, 1.0f, stream);
  if (unscale != nullptr) unscale_accumulate(unscale, 1, found_inf_.data(), stream);
}

void CudaBackend::round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor) {
  monitor.record_of(layer_id).sent_grad = true;
  round_gradient(t.data(), static_cast<std::size_t>(t.size()), 1.0f, GradSite::upstream, layer_id, p,
                 monitor);
}

void CudaBackend::round_output(Tensor& t, const Precision& p) {
  if (p.format == Format::fp32) return;
  quantize(t.data(), t.data(), static_cast<std::size_t>(t.size()), p.format, p.round, 1.0f, ctx_.stream());
}

void CudaBackend::round_working_copy(const Parameter& master, Tensor& working, const Precision& p,
                                     std::uint16_t* half, DeviceType half_type) {
  working.resize(master.value.shape());
  const CopyJob job{master.value.data(), working.data(), half, static_cast<std::size_t>(master.value.size()),
                    half_type};
  if (!queue_copies_) {
    round_copies(&job, 1, p.format, p.round, ctx_.stream());
    return;
  }
  // One launch rounds to one format: a rounding of another precision sends the queue first.
  if (!copy_jobs_.empty() && (p.format != copy_precision_.format ||
                              p.round.e4m3_overflow_to_nan != copy_precision_.round.e4m3_overflow_to_nan)) {
    round_copies(copy_jobs_.data(), copy_jobs_.size(), copy_precision_.format, copy_precision_.round, ctx_.stream());
    copy_jobs_.clear();
  }
  copy_precision_ = p;
  copy_jobs_.push_back(job);
}

void CudaBackend::begin_prepare_weights() {
  copy_jobs_.clear();
  queue_copies_ = true;
}

void CudaBackend::end_prepare_weights() {
  queue_copies_ = false;
  if (copy_jobs_.empty()) return;
  std::vector<CopyJob> jobs;
  jobs.swap(copy_jobs_);  // empty even when the launch throws
  round_copies(jobs.data(), jobs.size(), copy_precision_.format, copy_precision_.round, ctx_.stream());
}
void CudaBackend::scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output,
                                      const UpstreamProduct& product, ScaledGrad& gx, BackwardContext& ctx,
                                      const UpstreamWrite& write) {
  LayerController* controller = ctx.scaler.layer_controller();
  if (controller != nullptr && device_decisions_ && ctx.reducer == nullptr) {  // data-parallel: the host's
    if (std::optional<ScaleRule> rule = controller->device_rule(layer.id())) {
      decide_on_device(*rule, *controller, layer, grad_output, product, gx, ctx, write);
      return;
    }
  }
  if (write) write(nullptr, nullptr, nullptr);  // gx.g, before anything below reads it
  const auto round_upstream = [&](float s) {
    round_gradient(gx.g.data(), static_cast<std::size_t>(gx.g.size()), s, GradSite::upstream, layer.id(),
                   ctx.precision, ctx.monitor);
  };
  if (controller == nullptr) {  // a global policy: s = 1, the scale passes on (host value or device entry)
    // A device entry's S_out is filled with its S_in by note_backward's pending note.
    const bool on_host = grad_output.device_scale < 0;
    send_at_local_scale(ctx.monitor, layer.id(), LocalScale{},
                        on_host ? grad_output.scale : std::numeric_limits<double>::quiet_NaN(),
                        round_upstream);
    gx.scale = grad_output.scale;
    gx.device_scale = grad_output.device_scale;
    return;
  }
  // The host decides: the statistics it asked for, copied now (one wait).
  const auto t0 = std::chrono::steady_clock::now();
  const double scale_in = host_scale(grad_output, ctx.monitor);
  LocalScaleQuery query =
      upstream_query(layer, grad_output, product, gx.g, ctx);  // no raw views: device data
  query.scale_in = scale_in;
  const LocalScale decision = decide_local_scale(
      *controller, std::move(query),
      [&](StatNeeds needs, QueryStatistics& stats, LocalScaleQuery& q) {
        // The statistics from the tensors' device views, batched into one copy (ArrayOps::attach, which
        // leaves the query without raw views); the log-moments from a host copy.
        q.grad = grad_output.g.data();
        q.weight = product.weight.size() > 0 ? product.weight.data() : nullptr;  // none without a GEMM
        q.upstream = gx.g.data();
        array_ops_->attach(stats, needs, q, ctx.precision.round);
        if ((needs & kNeedProductRange) && product.product_range) {  // the layer's closure copies to the host
          stats.products = product.product_range();
          q.products = &stats.products;
        }
      },
      ctx.reducer, ctx.scaler.policy(), ctx.monitor, t0);  // with a reducer: the whole batch's, as the CPU's
  gx.device_scale = -1;
  gx.scale = send_at_local_scale(ctx.monitor, layer.id(), decision, scale_in, round_upstream);
}

void CudaBackend::decide_on_device(ScaleRule rule, LayerController& controller, const Layer& layer,
                                   const ScaledGrad& grad_output, const UpstreamProduct& product,
                                   ScaledGrad& gx, BackwardContext& ctx, const UpstreamWrite& write) {
  const auto t0 = std::chrono::steady_clock::now();
  rule.reduction = static_cast<double>(product.reduction);
  // The statistics the formula reads, into query_stats_ by the launch that then decides: the moments of
  // g and W, or those of the fp32 upstream product (from the layer's own last pass when it hands one).
  const Format f = ctx.precision.gradient_format();
  const bool moments = rule_reads_moments(rule.formula), upstream = rule_reads_upstream(rule.formula);
  std::vector<StatsJob> jobs;
  if (moments) {
    jobs.push_back(job_of(grad_output.g.data(), grad_output.g.size(), f, ctx.precision.round));
    jobs.push_back(job_of(product.weight.data(), product.weight.size(), f, ctx.precision.round));
  }
  if (upstream) jobs.push_back(job_of(gx.g.data(), gx.g.size(), f, ctx.precision.round));
  const int e = new_scale_entry();
  // Taken by the statistics' launch, once they are complete.
  const StatsDecision decision = StatsDecision::local_scale(rule, scale_entry(grad_output), scale_at(e));
  if (write && upstream && !moments) {  // the product's own pass measures it and decides
    write(&jobs[0], query_stats_.data(), &decision);
  } else {
    if (write) write(nullptr, nullptr, nullptr);
    tensor_stats(ctx_, jobs.data(), jobs.size(), query_stats_.data(), decision);
  }
  decisions_.push_back(PendingDecision{e, layer.id(), &controller, ctx.scaler.policy(), layer.name()});
  ctx.monitor.record_of(layer.id()).sent_grad = true;
  // s multiplies the fp32 accumulator before the one rounding, so s·g itself never overflows.
  round_gradient(gx.g.data(), static_cast<std::size_t>(gx.g.size()), 1.0f, GradSite::upstream, layer.id(),
                 ctx.precision, ctx.monitor, scale_at(e));
  gx.scale = std::numeric_limits<double>::quiet_NaN();  // known on the host after the step's copy
  gx.device_scale = e;
  ctx.monitor.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaBackend::accumulate_weight_grad(Tensor& g, const ScaledGrad& at, Parameter& param, int layer_id,
                                         const Precision& p, StepMonitor& monitor) {
  GS_CHECK_SHAPE(g.size() == param.grad.size(),
                 "gradient of " << param.name << " has shape " << shape_string(g.shape())
                                << ", parameter has " << shape_string(param.grad.shape()));
  const auto n = static_cast<std::size_t>(g.size());
  // As the CPU's accumulate_weight_grad: a host scale outside float32's range cannot be divided out, so
  // the step counts as non-finite (the scaler skips it) instead of failing; the gradient is still rounded
  // and measured.
  if (at.device_scale < 0 && !scale_in_float_range(at.scale)) {
    round_gradient(g.data(), n, 1.0f, GradSite::weight, layer_id, p, monitor);
    monitor.note_nonfinite(layer_id);
    return;
  }
  UnscaleJob job{g.data(), param.grad.data(), n, at.scale};
  if (at.device_scale >= 0) {
    job.scale_on_device = &scale_at(at.device_scale)->scale;
    unscaled_at_.push_back(PendingNote{at.device_scale, layer_id});  // its range is checked with the records
  }
  round_gradient(g.data(), n, 1.0f, GradSite::weight, layer_id, p, monitor, nullptr, &job);
}

void CudaBackend::accumulate_weight_grads(const Layer& layer, std::initializer_list<WeightGrad> grads,
                                          const ScaledGrad& at, BackwardContext& ctx) {
  LayerController* controller = weight_grad_controller(ctx.scaler, ctx.precision);
  const Precision& p = ctx.precision;
  LayerRecord& record = ctx.monitor.record_of(layer.id());
  record.weight_grad_scale = 1;
  if (ctx.reducer)  // data-parallel: each gradient summed over the ranks before its one rounding
    for (const WeightGrad& w : grads)
      ctx.reducer->reduce_sum_on_device(w.grad->data(), static_cast<std::size_t>(w.grad->size()));
  if (controller == nullptr) {  // r = 1
    for (const WeightGrad& w : grads) accumulate_weight_grad(*w.grad, at, *w.param, layer.id(), p, ctx.monitor);
    return;
  }
  const std::optional<double> bound = controller->device_weight_grad_bound(layer.id());
  if (bound && device_decisions_) {
    // Each r on the device from its gradient's own statistics: a gradient of one block's values decides
    // it in its rounding's launch; the larger ones in one launch for the layer (up to
    // StatsDecision::kMaxTensors at a time) that decides them. Then each rounding, in order.
    const DeviceScale* in = scale_entry(at);
    std::vector<int> entries;
    std::vector<StatsJob> jobs;
    std::vector<DeviceScale*> outs;
    for (const WeightGrad& w : grads) {
      entries.push_back(new_scale_entry());
      if (static_cast<std::size_t>(w.grad->size()) > one_block_values()) {
        jobs.push_back(job_of(w.grad->data(), w.grad->size(), p.gradient_format(), p.round));
        outs.push_back(scale_at(entries.back()));
      }
    }
    for (std::size_t first = 0; first < jobs.size(); first += StatsDecision::kMaxTensors) {
      const std::size_t count = std::min(jobs.size() - first, static_cast<std::size_t>(StatsDecision::kMaxTensors));
      tensor_stats(ctx_, jobs.data() + first, count, query_stats_.data(),
                   StatsDecision::weight_grad_scale_each(*bound, in, outs.data() + first, static_cast<int>(count)));
    }
    std::size_t k = 0;
    for (const WeightGrad& w : grads) {
      const int e = entries[k++];
      const auto n = static_cast<std::size_t>(w.grad->size());
      weight_grad_scales_.push_back(PendingNote{e, layer.id()});  // resolve_scales keeps the smallest r
      unscaled_at_.push_back(PendingNote{e, layer.id()});
      UnscaleJob unscale{w.grad->data(), w.param->grad.data(), n, 1.0};
      unscale.scale_on_device = &scale_at(e)->scale;
      const WeightGradDecision r{*bound, in, scale_at(e)};
      round_gradient(w.grad->data(), n, 1.0f, GradSite::weight, layer.id(), p, ctx.monitor, scale_at(e), &unscale,
                     n <= one_block_values() ? &r : nullptr);
    }
    return;
  }
  bool first = true;
  for (const WeightGrad& w : grads) {
    const auto n = static_cast<std::size_t>(w.grad->size());
    const StatsJob job = job_of(w.grad->data(), w.grad->size(), p.gradient_format(), p.round);
    // The host decides: the maximum now (one wait), S_in on the host.
    const auto t0 = std::chrono::steady_clock::now();
    const TensorStats s = statistics_now({job}).at(0);
    const float m = s.nonfinite > 0 ? std::numeric_limits<float>::infinity() : static_cast<float>(s.max_abs);
    const double scale_in = host_scale(at, ctx.monitor);
    const double r = checked_weight_grad_scale(*controller, layer.id(), layer.name(), ctx.step,
                                               p.gradient_format(), scale_in, m, ctx.scaler.policy());
    ctx.monitor.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    keep_smallest_weight_grad_scale(record, r, first);
    first = false;
    // As the CPU's accumulate_weight_grad: a scale outside float32's range cannot be divided out.
    if (!scale_in_float_range(r * scale_in)) {
      round_gradient(w.grad->data(), n, static_cast<float>(r), GradSite::weight, layer.id(), p, ctx.monitor);
      ctx.monitor.note_nonfinite(layer.id());
      continue;
    }
    UnscaleJob unscale{w.grad->data(), w.param->grad.data(), n, r * scale_in};
    round_gradient(w.grad->data(), n, static_cast<float>(r), GradSite::weight, layer.id(), p, ctx.monitor,
                   nullptr, &unscale);
  }
}

}  // namespace gradscale::cuda
