// The precision model for a backward pass computed by another engine (see external_backward.h). Every
// rounding keeps round_gradient's contract (lib/layers/precision_ops.cpp; on a device its records are
// made at the next flush, in order) and every local scale goes through the checked controller decision,
// exactly as for gradscale's own layers.
#include "lib/train/external_backward.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "lib/core/json_read.h"
#include "lib/layers/precision_ops.h"
#include "lib/layers/scale_step.h"
#include "lib/model/join.h"
#include "lib/scaler/scale_range.h"
#include "lib/train/scaler_setup.h"
#include "lib/train/verdict.h"

namespace gradscale {
namespace {

// round_gradient without statistics: the found_inf check, charged to `layer` (-1: outside every layer).
void round_unrecorded(ArrayOps& ops, const float* src, float* d, std::size_t n, const RoundingScales& scales,
                      GradSite site, const Precision& p, StepMonitor& monitor, int layer) {
  auto scratch = std::make_shared<StepMonitor>();  // lives until the records are made
  scratch->gradient_edge = monitor.gradient_edge;  // popart_als counts every weight gradient
  // Record off: the scratch's layer 0 is never read.
  ops.queue_scaled_rounding(src, d, n, scales, site, 0, p, *scratch, [scratch, &monitor, site, layer](float m) {
    monitor.grad_below_edge += scratch->grad_below_edge;
    monitor.grad_above_edge += scratch->grad_above_edge;
    if (scratch->found_inf) monitor.note_overflow(site, layer, m, scratch->nonfinite_stored);
  });
}

RoundingScales by(float multiplier) {
  RoundingScales s;
  s.multiplier = multiplier;
  return s;
}

}  // namespace

ExternalBackward::ExternalBackward(std::vector<LayerInfo> layers, const Precision& precision,
                                   std::unique_ptr<Scaler> scaler, const std::string& device)
    : layers_(std::move(layers)),
      precision_(precision),
      device_(device),
      backend_(device == "cpu" ? nullptr : make_backend(device)),
      ops_(backend_ ? &backend_->array_ops() : &host_array_ops()),
      scaler_(std::move(scaler)),
      loss_scale_(std::numeric_limits<double>::quiet_NaN()) {
  GS_CHECK_CONFIG(scaler_ != nullptr, "ExternalBackward: no scaler given (use {\"policy\": \"none\"} for none)");
  GS_CHECK_CONFIG(!layers_.empty(), "ExternalBackward: the layer table is empty (a model without parameters?)");
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerInfo& l = layers_[i];
    GS_CHECK_CONFIG(l.id == static_cast<int>(i),
                    "ExternalBackward: layer '" << l.name << "' has id " << l.id << ", expected " << i);
    GS_CHECK_CONFIG(!l.parametric || (l.reduction > 0 && !l.weight_shape.empty()),
                    "ExternalBackward: parametric layer '" << l.name << "' needs a reduction length K > 0 and "
                                                           << "a weight shape");
  }
  scaler_->bind(layers_, precision_.gradient_format());
  refuse_controller_off_gemm(*scaler_, layers_, "ExternalBackward",
                             "layers computed elsewhere take local scales at Linear and Conv2d only in this version");
}

ExternalBackward::ExternalBackward(std::vector<LayerInfo> layers, const Precision& precision,
                                   const nlohmann::json& scaler, const std::string& device)
    : ExternalBackward(std::move(layers), precision, make_scaler_for(scaler, precision), device) {}

ExternalBackward::~ExternalBackward() = default;

void ExternalBackward::set_layer_inputs(const std::vector<std::vector<int>>& inputs) {
  GS_CHECK_CONFIG(inputs.size() == layers_.size(), "ExternalBackward::set_layer_inputs: " << inputs.size()
                                                       << " lists of inputs for " << layers_.size() << " layers");
  GS_CHECK_AS(Error, !in_step_, "ExternalBackward::set_layer_inputs inside an iteration (call it before begin_step)");
  for (std::size_t i = 0; i < inputs.size(); ++i)
    for (int in : inputs[i])
      GS_CHECK_CONFIG(in >= -1 && static_cast<std::size_t>(in + 1) <= layers_.size(),
                      "ExternalBackward::set_layer_inputs: layer '" << layers_[i].name << "' reads layer id " << in
                                                                    << ", outside the table of " << layers_.size()
                                                                    << " layers (-1: the model's input)");
  for (std::size_t i = 0; i < inputs.size(); ++i) layers_[i].inputs = inputs[i];
  // bind() starts a policy's per-layer state afresh: what it had is put back.
  const nlohmann::json state = scaler_->state();
  scaler_->bind(layers_, precision_.gradient_format());
  scaler_->restore_state(state);
}

void ExternalBackward::check_layer(int layer, bool allow_none, const char* call) const {
  GS_CHECK_CONFIG((allow_none && layer == -1) || (layer >= 0 && static_cast<std::size_t>(layer) < layers_.size()),
                  "ExternalBackward::" << call << ": layer id " << layer << " outside the table of "
                                       << layers_.size() << " layers");
  GS_CHECK_AS(Error, in_step_,
              "ExternalBackward::" << call << " outside an iteration (call begin_step first)");
}

void ExternalBackward::begin_step(bool record_statistics) {
  flush_arrays();  // what an abandoned pass queued goes to its own records, which the reset clears
  held_.clear();
  monitor_.reset(static_cast<int>(layers_.size()), record_statistics, scaler_->gradient_edge());
  wgrad_seen_.assign(layers_.size(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  scaler_->begin_step(steps_);
  monitor_.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  loss_scale_ = std::numeric_limits<double>::quiet_NaN();
  loss_held_ = -1;
  in_step_ = true;
}

double ExternalBackward::loss_scale() {
  if (std::isnan(loss_scale_) && loss_held_ >= 0) scale_value(ScaleHandle{loss_held_});  // its callback sets it
  return loss_scale_;
}

ScaleHandle ExternalBackward::loss_gradient_held(const float* src, float* g, std::int64_t n) {
  check_layer(-1, true, "loss_gradient");
  GS_CHECK_SHAPE(n >= 0 && (n == 0 || (g != nullptr && src != nullptr)),
                 "ExternalBackward::loss_gradient: " << n << " values");
  if (loss_held_ < 0 && std::isnan(loss_scale_) && device_scales()) {
    if (const std::optional<LossScaleRule> rule = scaler_->device_loss_rule()) {  // S0 on the device: no wait
      const int e = ops_->decide_loss_scale(*rule, src, static_cast<std::size_t>(n), precision_.gradient_format(),
                                            precision_.round);
      loss_held_ = hold_entry(e, [this, policy = std::string(scaler_->policy())](const ScaleEntry& d) {
                     GS_CHECK_NUMERIC(std::isfinite(d.scale) && d.scale > 0,
                                      "scaler '" << policy << "' chose loss scale " << d.scale << " on the device");
                     loss_scale_ = d.scale;
                     scaler_->accept_loss_scale(d.scale, d.unbound);
                   }).id;
    }
  }
  if (loss_held_ < 0) {  // the host chooses (or chose) S0: the double form
    loss_held_ = hold(loss_gradient(src, g, n)).id;
    return ScaleHandle{loss_held_};
  }
  const HeldScale& s0 = held(ScaleHandle{loss_held_}, "loss_gradient");
  if (!std::isnan(s0.scale) || s0.entry < 0) {  // known on the host by now: the double form at that S0
    loss_gradient(src, g, n);
    return ScaleHandle{loss_held_};
  }
  // As the double form, with S0 read from the table: S0·g in fp32, then the one rounding at the loss site.
  RoundingScales scales;
  scales.multiply_by = s0.entry;
  round_loss_gradient(src, g, n, scales);
  return ScaleHandle{loss_held_};
}

double ExternalBackward::loss_gradient(const float* src, float* g, std::int64_t n) {
  check_layer(-1, true, "loss_gradient");
  GS_CHECK_SHAPE(n >= 0 && (n == 0 || (g != nullptr && src != nullptr)),
                 "ExternalBackward::loss_gradient: " << n << " values");
  if (std::isnan(loss_scale_) && loss_held_ >= 0) loss_scale();  // S0 chosen on the device: its value
  if (std::isnan(loss_scale_)) {
    const auto t0 = std::chrono::steady_clock::now();
    // A policy that looks at the loss gradient reads it on the host (small: the outputs' size).
    std::vector<float> host;
    const float* view = src;
    if (!ops_->host_memory() && scaler_->loss_needs()) {
      host.resize(static_cast<std::size_t>(n));
      ops_->to_host(src, host.size(), host.data());
      view = host.data();
    }
    const double s0 = choose_loss_scale(*scaler_, view, Shape{n}, steps_, precision_, reducer_);
    loss_scale_ = s0;
    monitor_.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  round_loss_gradient(src, g, n, by(static_cast<float>(loss_scale_)));
  return loss_scale_;
}

void ExternalBackward::round_loss_gradient(const float* src, float* g, std::int64_t n,
                                           const RoundingScales& scales) {
  // The loss gradient is attributed to the last layer (as gradscale's own models do: the layer whose
  // output the loss reads), so a non-finite loss gradient names it.
  const int last = static_cast<int>(layers_.size()) - 1;
  ops_->queue_scaled_rounding(src, g, static_cast<std::size_t>(n), scales, GradSite::loss, last, precision_, monitor_,
                              [this](float m) {
                                if (m > monitor_.loss_grad_max_abs || std::isnan(m)) monitor_.loss_grad_max_abs = m;
                              });
}

void ExternalBackward::note_shadow(int layer, bool weight, const ShadowMetrics& metrics) {
  check_layer(layer, false, "note_shadow");
  LayerRecord& r = monitor_.record_of(layer);
  (weight ? r.shadow_weight : r.shadow_upstream) = metrics;
  (weight ? r.has_shadow_weight : r.has_shadow_upstream) = true;
}

void ExternalBackward::note_layer(int layer, double scale_in) {
  check_layer(layer, false, "note_layer");
  LayerRecord& r = monitor_.record_of(layer);
  if (r.ran) return;  // a layer called twice keeps the S_in of its first backward
  gradscale::note_backward(layer, scale_in, monitor_);
}

double ExternalBackward::upstream(int layer, const float* src, float* upstream, const Shape& upstream_shape,
                                  const float* grad, const Shape& grad_shape, const float* weight,
                                  const Shape& weight_shape, double scale_in) {
  check_layer(layer, false, "upstream");
  GS_CHECK_NUMERIC(std::isfinite(scale_in) && scale_in > 0,
                   "ExternalBackward::upstream: layer '" << layers_[static_cast<std::size_t>(layer)].name
                                                         << "' received scale " << scale_in);
  const LayerInfo& info = layers_[static_cast<std::size_t>(layer)];
  note_layer(layer, scale_in);
  LocalScale decision;  // s = 1 under a global policy and at a layer without a GEMM
  LayerController* controller = scaler_->layer_controller();
  if (controller && info.parametric) {
    const auto t0 = std::chrono::steady_clock::now();
    LocalScaleQuery query = upstream_query(layer, info.name, steps_, precision_.gradient_format(), scale_in,
                                           info.reduction, grad_shape, weight_shape, upstream_shape);
    query.grad = grad;  // either may be null: refused below if the controller reads it
    query.grad_size = grad ? query.grad_size : 0;
    query.weight = weight;
    query.weight_size = weight ? query.weight_size : 0;
    query.upstream = src;  // the fp32 product before its one rounding
    decision = decide_local_scale(
        *controller, std::move(query),
        [&](StatNeeds needs, QueryStatistics& stats, LocalScaleQuery& q) {
          GS_CHECK_CONFIG(!(needs & (kNeedGradMoments | kNeedGradLogMoments)) || grad,
                          "ExternalBackward::upstream: the controller needs the gradient layer '" << info.name
                                                                                                  << "' received");
          GS_CHECK_CONFIG(!(needs & kNeedWeightMoments) || weight,
                          "ExternalBackward::upstream: the controller needs the weight of layer '" << info.name
                                                                                                   << "'");
          GS_CHECK_CONFIG(!(needs & kNeedProductRange),
                          "ExternalBackward::upstream: method element_wise needs the partial products of "
                          "gradscale's own Linear/Conv2d; it is not available for layers computed elsewhere");
          ops_->attach(stats, needs, q, precision_.round);
        },
        reducer_, scaler_->policy(), monitor_, t0);  // with a reducer: every rank decides on the whole batch's
  }
  send_at_local_scale(monitor_, layer, decision, scale_in, [&](float s) {
    round_upstream(layer, src, upstream, static_cast<std::size_t>(shape_size(upstream_shape)), by(s));
  });
  return decision.s;
}

void ExternalBackward::round_upstream(int layer, const float* src, float* upstream, std::size_t n,
                                      const RoundingScales& scales) {
  ops_->queue_scaled_rounding(src, upstream, n, scales, GradSite::upstream, layer, precision_, monitor_,
                              [this, layer](float m) {
                                LayerRecord& sent = monitor_.record_of(layer);
                                if (m > sent.sent_max_abs || std::isnan(m)) sent.sent_max_abs = m;
                              });
}

double ExternalBackward::join_target(std::vector<double> max_abs, const std::vector<double>& scales) {
  if (reducer_) reducer_->reduce_max(max_abs.data(), max_abs.size());
  return join_target_scale(max_abs, scales, precision_.gradient_format());
}

void ExternalBackward::round_join(int layer, float* sum, std::int64_t n) {
  check_layer(layer, true, "round_join");
  if (layer < 0)
    round_unrecorded(*ops_, sum, sum, static_cast<std::size_t>(n), by(1.0f), GradSite::join, precision_, monitor_, -1);
  else
    ops_->queue_rounding(sum, sum, static_cast<std::size_t>(n), 1.0f, GradSite::join, layer, precision_, monitor_,
                         {});
}

void ExternalBackward::round_received(int layer, const float* src, float* g, std::int64_t n) {
  check_layer(layer, false, "round_received");
  round_unrecorded(*ops_, src, g, static_cast<std::size_t>(n), by(1.0f), GradSite::join, precision_, monitor_,
                   layer);
}

void ExternalBackward::weight_gradient(int layer, const float* src, float* g, std::int64_t n, double scale) {
  check_layer(layer, true, "weight_gradient");
  GS_CHECK_NUMERIC(std::isfinite(scale) && scale > 0, "ExternalBackward::weight_gradient: scale " << scale);
  const auto count = static_cast<std::size_t>(n);
  // SPEC §6.5: a per-layer policy stores the part at its own factor r, chosen from its fp32 maximum.
  double r = 1.0;
  LayerController* controller = weight_grad_controller(*scaler_, precision_);
  if (layer >= 0 && controller != nullptr && device_scales()) {
    // On a device, r from the controller's rule where the data is: no wait (one process; data-parallel
    // ranks reduce their maxima on the host below).
    if (const std::optional<double> bound = controller->device_weight_grad_bound(layer)) {
      queue_device_weight_gradient(layer, src, g, count, *bound, ops_->new_scale(scale));
      return;
    }
  }
  if (layer >= 0 && controller != nullptr) {
    double max_abs = ops_->max_abs(src, count);
    // Data-parallel: each rank holds its rows' part (the framework averages the true gradients later),
    // so the ranks take r from the largest of their maxima and store their parts alike.
    if (reducer_) reducer_->reduce_max(&max_abs, 1);
    const std::size_t l = static_cast<std::size_t>(layer);
    r = checked_weight_grad_scale(*controller, layer, layers_[l].name, steps_, precision_.gradient_format(), scale,
                                  max_abs, scaler_->policy());
    // The record keeps the smallest r among the layer's parts this step, as accumulate_weight_grads does.
    keep_smallest_weight_grad_scale(monitor_.record_of(layer), r, !wgrad_seen_[l]);
    wgrad_seen_[l] = 1;
  }
  // Unscale in fp32 (SPEC §4), as accumulate_weight_grad does: g / (r·S), exact for powers of two, in
  // the rounding's pass. As accumulate_weight_grad: a scale outside float32's range cannot be divided
  // out, so the step counts as non-finite (the scaler skips it), after the rounding's own check.
  const bool divides = scale_in_float_range(r * scale);
  RoundingScales scales = by(static_cast<float>(r));  // r = 1 outside every layer
  scales.divide = divides;
  scales.divisor = static_cast<float>(r * scale);
  if (layer < 0)
    round_unrecorded(*ops_, src, g, count, scales, GradSite::weight, precision_, monitor_, -1);
  else
    ops_->queue_scaled_rounding(src, g, count, scales, GradSite::weight, layer, precision_, monitor_, {});
  if (!divides) ops_->queue([this, layer] { monitor_.note_nonfinite(layer); });
}

// ---- held scales ----------------------------------------------------------------------------------------

ExternalBackward::HeldScale& ExternalBackward::held(ScaleHandle h, const char* call) {
  GS_CHECK_CONFIG(h.id >= 0 && static_cast<std::size_t>(h.id) < held_.size(),
                  "ExternalBackward::" << call << ": scale handle " << h.id
                                       << " is not in this iteration's table (" << held_.size()
                                       << " scales; a handle lasts until the next begin_step)");
  return held_[static_cast<std::size_t>(h.id)];
}

ScaleHandle ExternalBackward::hold(double scale, double local) {
  held_.push_back(HeldScale{scale, local, -1});
  return ScaleHandle{static_cast<int>(held_.size()) - 1};
}

ScaleHandle ExternalBackward::hold_entry(int entry, std::function<void(const ScaleEntry&)> then,
                                         double local) {
  const bool own_local = std::isnan(local);
  const ScaleHandle h = hold(std::numeric_limits<double>::quiet_NaN(), local);
  held_.back().entry = entry;
  // Runs at the flush that brings the entry back, before begin_step clears the table.
  ops_->queue_scale(entry, [this, h, own_local, then = std::move(then)](const ScaleEntry& e) {
    HeldScale& s = held_[static_cast<std::size_t>(h.id)];
    s.scale = e.scale;
    if (own_local) s.local = e.local;
    if (then) then(e);
  });
  return h;
}

int ExternalBackward::entry_of(ScaleHandle h) {
  HeldScale& s = held(h, "entry_of");
  if (s.entry < 0) s.entry = ops_->new_scale(s.scale);  // a scale without an entry has its host value
  return s.entry;
}

void ExternalBackward::flush_arrays() {
  // The device's table starts again, even when a record's check throws (ArrayOps::flush runs every
  // queued item first): no held scale keeps an entry of the old table.
  struct ClearEntries {
    std::vector<HeldScale>& held;
    ~ClearEntries() {
      for (HeldScale& s : held) s.entry = -1;
    }
  } clear{held_};
  ops_->flush();
}

ScaleHandle ExternalBackward::scale_handle(double value) {
  check_layer(-1, true, "scale_handle");
  GS_CHECK_NUMERIC(std::isfinite(value) && value > 0, "ExternalBackward::scale_handle: scale " << value);
  return hold(value);
}

double ExternalBackward::scale_value(ScaleHandle h) {
  if (std::isnan(held(h, "scale_value").scale)) flush_arrays();  // one wait: it comes with the measurements
  return held(h, "scale_value").scale;
}

double ExternalBackward::local_value(ScaleHandle h) {
  if (std::isnan(held(h, "local_value").local)) flush_arrays();
  return held(h, "local_value").local;
}

void ExternalBackward::note_layer(int layer, ScaleHandle scale_in) {
  check_layer(layer, false, "note_layer");
  const HeldScale& s = held(scale_in, "note_layer");
  if (!std::isnan(s.scale)) {
    note_layer(layer, s.scale);
    return;
  }
  LayerRecord& r = monitor_.record_of(layer);
  if (r.ran) return;  // a layer called twice keeps the S_in of its first backward
  r.ran = true;
  r.scale_in = r.scale_out = std::numeric_limits<double>::quiet_NaN();  // until the device's value arrives
  ops_->queue_scale(s.entry, [this, layer](const ScaleEntry& e) {
    LayerRecord& rec = monitor_.record_of(layer);
    rec.scale_in = e.scale;
    if (std::isnan(rec.scale_out)) rec.scale_out = e.scale;  // S_out: S_in, unless a later call set it
  });
}

ScaleHandle ExternalBackward::upstream(int layer, const float* src, float* upstream,
                                       const Shape& upstream_shape, const float* grad,
                                       const Shape& grad_shape, const float* weight,
                                       const Shape& weight_shape, ScaleHandle scale_in) {
  check_layer(layer, false, "upstream");
  const LayerInfo& info = layers_[static_cast<std::size_t>(layer)];
  const auto n = static_cast<std::size_t>(shape_size(upstream_shape));
  LayerController* controller = info.parametric ? scaler_->layer_controller() : nullptr;
  std::optional<ScaleRule> rule;
  if (controller != nullptr && device_scales()) rule = controller->device_rule(layer);
  const bool on_host = !std::isnan(held(scale_in, "upstream").scale);
  if (!rule &&
      (on_host || controller != nullptr)) {  // the host decides (waiting for S_in if the device has it)
    const double in = scale_value(scale_in);
    const double s =
        this->upstream(layer, src, upstream, upstream_shape, grad, grad_shape, weight, weight_shape, in);
    return hold(s * in, s);
  }
  note_layer(layer, scale_in);
  if (!rule) {  // s = 1 on a scale only the device knows: the gradient keeps it, S_out = S_in
    send_at_local_scale(monitor_, layer, LocalScale{}, std::numeric_limits<double>::quiet_NaN(),
                        [&](float s) { round_upstream(layer, src, upstream, n, by(s)); });
    return hold_entry(
        entry_of(scale_in),
        [this, layer](const ScaleEntry& v) {
          monitor_.record_of(layer).scale_out = v.scale;  // this call's, as the double form leaves it
        },
        1.0);
  }
  // The controller's rule on the device (CudaBackend::decide_on_device's steps): no wait.
  const auto t0 = std::chrono::steady_clock::now();
  ScaleRule r = *rule;
  r.reduction = static_cast<double>(info.reduction);
  const bool moments = rule_reads_moments(r.formula);
  GS_CHECK_CONFIG(!moments || grad, "ExternalBackward::upstream: the controller needs the gradient layer '"
                                        << info.name << "' received");
  GS_CHECK_CONFIG(!moments || weight, "ExternalBackward::upstream: the controller needs the weight of layer '"
                                          << info.name << "'");
  const Format f = precision_.gradient_format();
  const int e = ops_->decide_scale(r, grad, grad ? static_cast<std::size_t>(shape_size(grad_shape)) : 0,
                                   weight, weight ? static_cast<std::size_t>(shape_size(weight_shape)) : 0,
                                   src, n, f, precision_.round, entry_of(scale_in));
  monitor_.record_of(layer).sent_grad = true;
  const ScaleHandle out =
      hold_entry(e, [this, layer, controller, policy = std::string(scaler_->policy())](const ScaleEntry& d) {
        LayerRecord& rec = monitor_.record_of(layer);
        check_local_scale(d.local, policy, layers_[static_cast<std::size_t>(layer)].name);
        rec.local_scale = d.local;
        rec.unbound_scale = d.unbound;
        rec.scale_limit = d.limit;
        rec.scale_out = d.scale;
        controller->accept(layer, LocalScale{d.local, d.unbound, d.limit});
      });
  // s multiplies the fp32 product before its one rounding, so s·g itself never overflows.
  RoundingScales scales;
  scales.multiply_by = e;
  round_upstream(layer, src, upstream, n, scales);
  monitor_.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

ScaleHandle ExternalBackward::join(const std::vector<const float*>& parts,
                                   const std::vector<std::int64_t>& sizes,
                                   const std::vector<ScaleHandle>& scales) {
  check_layer(-1, true, "join");
  GS_CHECK_SHAPE(!parts.empty() && parts.size() == sizes.size() && parts.size() == scales.size(),
                 "ExternalBackward::join: " << parts.size() << " parts, " << sizes.size() << " sizes, "
                                            << scales.size() << " scales");
  std::vector<std::size_t> n;
  for (std::int64_t size : sizes) {
    GS_CHECK_SHAPE(size >= 0, "ExternalBackward::join: a part of " << size << " values");
    n.push_back(static_cast<std::size_t>(size));
  }
  if (device_scales() && parts.size() <= ops_->max_join_parts()) {  // T on the device: no wait
    std::vector<int> entries;
    for (ScaleHandle h : scales) entries.push_back(entry_of(h));
    return hold_entry(
        ops_->join_scale(parts.data(), n.data(), entries.data(), parts.size(), precision_.gradient_format()));
  }
  std::vector<float> maxima(parts.size());
  ops_->max_abs_each(parts.data(), n.data(), parts.size(), maxima.data());  // one wait on a device
  std::vector<double> values;
  for (ScaleHandle h : scales) values.push_back(scale_value(h));
  return hold(join_target(std::vector<double>(maxima.begin(), maxima.end()), values));
}

void ExternalBackward::sum_scaled_parts(const std::vector<const float*>& parts,
                                        const std::vector<ScaleHandle>& scales, ScaleHandle target,
                                        float* out, std::int64_t n) {
  check_layer(-1, true, "sum_scaled_parts");
  GS_CHECK_SHAPE(parts.size() == scales.size() && n >= 0,
                 "ExternalBackward::sum_scaled_parts: " << parts.size() << " parts, " << scales.size()
                                                        << " scales, n = " << n);
  bool on_host = !std::isnan(held(target, "sum_scaled_parts").scale);
  for (ScaleHandle h : scales) on_host = on_host && !std::isnan(held(h, "sum_scaled_parts").scale);
  if (on_host) {
    std::vector<double> values;
    for (ScaleHandle h : scales) values.push_back(held(h, "sum_scaled_parts").scale);
    ops_->sum_scaled_parts(parts.data(), values.data(), parts.size(), held(target, "sum_scaled_parts").scale,
                           out, static_cast<std::size_t>(n));
    return;
  }
  std::vector<int> entries;
  for (ScaleHandle h : scales) entries.push_back(entry_of(h));
  ops_->sum_scaled_parts_at(parts.data(), entries.data(), parts.size(), entry_of(target), out,
                            static_cast<std::size_t>(n));
}

void ExternalBackward::weight_gradient(int layer, const float* src, float* g, std::int64_t n,
                                       ScaleHandle scale) {
  check_layer(layer, true, "weight_gradient");
  if (!std::isnan(held(scale, "weight_gradient").scale)) {
    weight_gradient(layer, src, g, n, held(scale, "weight_gradient").scale);
    return;
  }
  const auto count = static_cast<std::size_t>(n);
  LayerController* controller = layer >= 0 ? weight_grad_controller(*scaler_, precision_) : nullptr;
  if (controller != nullptr) {
    const std::optional<double> bound = controller->device_weight_grad_bound(layer);
    if (!bound) {  // the host chooses r: it waits for S
      weight_gradient(layer, src, g, n, scale_value(scale));
      return;
    }
    queue_device_weight_gradient(layer, src, g, count, *bound, entry_of(scale));
    return;
  }
  // r = 1: rounded, then divided by S on the device; S's range is checked when it arrives (as the
  // double form checks it before dividing).
  const int e = entry_of(scale);
  RoundingScales scales;  // rounded and divided in one pass
  scales.divide_by = e;
  if (layer < 0)
    round_unrecorded(*ops_, src, g, count, scales, GradSite::weight, precision_, monitor_, -1);
  else
    ops_->queue_scaled_rounding(src, g, count, scales, GradSite::weight, layer, precision_, monitor_, {});
  ops_->queue_scale(e, [this, layer](const ScaleEntry& v) {
    if (!scale_in_float_range(v.scale)) monitor_.note_nonfinite(layer);
  });
}

void ExternalBackward::queue_device_weight_gradient(int layer, const float* src, float* g, std::size_t n,
                                                    double bound, int scale_entry) {
  const auto l = static_cast<std::size_t>(layer);
  const bool first = !wgrad_seen_[l];
  ops_->queue_weight_gradient(src, g, n, bound, scale_entry, layer, precision_, monitor_,
                              [this, layer, first](double decided) {
                                keep_smallest_weight_grad_scale(monitor_.record_of(layer), decided, first);
                              });
  wgrad_seen_[l] = 1;
}

std::vector<double> ExternalBackward::agreement_buffer() {
  flush_arrays();
  // [found_inf, below edge, above edge, found outside every layer, one slot per layer: named first]
  std::vector<double> b(layers_.size() + 4, 0.0);
  b[0] = monitor_.found_inf ? 1 : 0;
  b[1] = static_cast<double>(monitor_.grad_below_edge);
  b[2] = static_cast<double>(monitor_.grad_above_edge);
  if (monitor_.found_inf) {
    if (monitor_.first_nonfinite_layer < 0)
      b[3] = 1;
    else
      b[4 + static_cast<std::size_t>(monitor_.first_nonfinite_layer)] = 1;
  }
  return b;
}

void ExternalBackward::agree(const std::vector<double>& summed) {
  check_layer(-1, true, "agree");
  GS_CHECK_SHAPE(summed.size() == layers_.size() + 4,
                 "ExternalBackward::agree: a buffer of " << summed.size() << " values, expected "
                                                         << layers_.size() + 4 << " (agreement_buffer())");
  monitor_.found_inf = summed[0] > 0;
  monitor_.grad_below_edge = static_cast<std::uint64_t>(summed[1]);
  monitor_.grad_above_edge = static_cast<std::uint64_t>(summed[2]);
  monitor_.first_nonfinite_layer = -1;
  for (std::size_t i = 0; i < layers_.size() && monitor_.found_inf; ++i)
    if (summed[4 + i] > 0) {
      monitor_.first_nonfinite_layer = static_cast<int>(i);
      break;
    }
}

namespace {
constexpr std::size_t kOverflowHead = 3, kOverflowPerLayer = 4;  // overflow_buffer's layout
}  // namespace

std::vector<double> ExternalBackward::overflow_buffer() {
  flush_arrays();
  // [a stored value not finite, loss overflow, its max; per layer: overflow upstream, weight, join, max]
  std::vector<double> b(kOverflowHead + kOverflowPerLayer * layers_.size(), 0.0);
  b[0] = monitor_.nonfinite_stored ? 1 : 0;
  b[1] = monitor_.loss_overflow ? 1 : 0;
  b[2] = monitor_.loss_overflow_max_abs;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerRecord& r = monitor_.records[i];
    double* l = b.data() + kOverflowHead + kOverflowPerLayer * i;
    l[0] = r.overflow_upstream ? 1 : 0;
    l[1] = r.overflow_weight ? 1 : 0;
    l[2] = r.overflow_join ? 1 : 0;
    l[3] = r.overflow_max_abs;
  }
  return b;
}

void ExternalBackward::agree_overflows(const std::vector<double>& summed) {
  check_layer(-1, true, "agree_overflows");
  const std::size_t expected = kOverflowHead + kOverflowPerLayer * layers_.size();
  GS_CHECK_SHAPE(summed.size() == expected, "ExternalBackward::agree_overflows: a buffer of "
                                                << summed.size() << " values, expected " << expected
                                                << " (overflow_buffer())");
  monitor_.nonfinite_stored = summed[0] > 0;
  monitor_.loss_overflow = summed[1] > 0;
  monitor_.loss_overflow_max_abs = static_cast<float>(summed[2]);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const double* l = summed.data() + kOverflowHead + kOverflowPerLayer * i;
    LayerRecord& r = monitor_.records[i];
    r.overflow_upstream = l[0] > 0;
    r.overflow_weight = l[1] > 0;
    r.overflow_join = l[2] > 0;
    r.overflow_max_abs = static_cast<float>(l[3]);
  }
}

StepResult ExternalBackward::finish_step(double loss) {
  check_layer(-1, true, "finish_step");
  flush_arrays();
  StepResult r;
  r.loss = loss;
  r.loss_scale = loss_scale_;
  scaler_verdict(*scaler_, monitor_, steps_, r);
  r.step = ++steps_;
  in_step_ = false;
  return r;
}

void ExternalBackward::abandon_step() {
  flush_arrays();  // what the failed pass queued lands in this iteration's records, not the next one's
  in_step_ = false;
  loss_scale_ = std::numeric_limits<double>::quiet_NaN();
  loss_held_ = -1;
}

std::vector<LayerScale> ExternalBackward::layer_scales() const {
  return layer_scale_rows(layers_, monitor_);
}

nlohmann::json ExternalBackward::trace_header(const nlohmann::json& config, std::uint64_t seed,
                                              const nlohmann::json& layers) const {
  return make_trace_header(config, precision_, scaler_->config(), seed, layers, "");
}

nlohmann::json ExternalBackward::layer_names() const {
  nlohmann::json names = nlohmann::json::array();
  for (const LayerInfo& l : layers_) names.push_back(l.name);
  return names;
}

nlohmann::json ExternalBackward::state() const {
  return {{"steps", steps_},
          {"layers", layer_names()},
          {"scaler", {{"config", scaler_->config()}, {"state", scaler_->state()}}}};
}

void ExternalBackward::restore_state(const nlohmann::json& state) {
  GS_CHECK_CONFIG(state.is_object() && state.contains("steps") && state.contains("layers") &&
                      state.contains("scaler") && state["scaler"].is_object() &&
                      state["scaler"].contains("config") && state["scaler"].contains("state"),
                  "scaler state: expected an object with 'steps', 'layers' and 'scaler': {config, state}, got "
                      << json_excerpt(state));
  const nlohmann::json& steps = state["steps"];
  GS_CHECK_CONFIG(steps.is_number_integer() && steps.get<std::int64_t>() >= 0,
                  "scaler state: 'steps' must be an integer >= 0, got " << json_excerpt(steps));
  GS_CHECK_CONFIG(state["layers"] == layer_names(),
                  "scaler state: saved for the layers " << json_excerpt(state["layers"]) << ", this model has "
                                                        << json_excerpt(layer_names()));
  GS_CHECK_CONFIG(state["scaler"]["config"] == scaler_->config(),
                  "scaler state: saved for the scaler " << json_excerpt(state["scaler"]["config"])
                                                        << ", this one is " << json_excerpt(scaler_->config()));
  scaler_->restore_state(state["scaler"]["state"]);
  steps_ = steps.get<std::int64_t>();
  in_step_ = false;
}

}  // namespace gradscale
