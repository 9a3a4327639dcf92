// The precision model of SPEC §4–§5 for a backward pass that another engine computes (PyTorch's
// autograd through the gradscale.torch plug-in, or a user's own code): the caller computes the fp32
// products, this object does everything gradscale decides — S0 at the loss gradient, the local scale of
// each layer from the statistics its controller asks for, the one rounding of every gradient to the
// gradient format (with found_inf and the §3 statistics), the join target of SPEC §5, the unscale of
// weight gradients, and the scaler's verdict. Nothing here knows the caller's graph: it is told which
// layer each tensor belongs to. Public through <gradscale/training.h>.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/backend/backend.h"
#include "lib/instrument/statistics_reducer.h"
#include "lib/instrument/step_monitor.h"
#include "lib/layers/layer.h"
#include "lib/scaler/scaler.h"
#include "lib/train/scaled_training.h"

namespace gradscale {

// A scale held in an ExternalBackward's table for one iteration (see ExternalBackward::scale_handle).
struct ScaleHandle {
  int id = -1;
};

class ExternalBackward {
 public:
  // `layers`: the caller's layer table (ids 0..L-1 in order; `parametric` layers with `reduction` K and
  // `weight_shape` ask the controller for a local scale, the others send their gradient at s = 1).
  // The scaler (owned) is bound to it for the gradient format of `precision`. `device` is where the
  // arrays handed over live (make_backend's names: "cpu", "cuda", "cuda:N"): every rounding, statistic
  // and maximum is taken there (lib/backend/array_ops.h), the decisions on the host.
  ExternalBackward(std::vector<LayerInfo> layers, const Precision& precision, std::unique_ptr<Scaler> scaler,
                   const std::string& device = "cpu");
  // The same with the scaler built from a configuration (as ScaledTraining: an object or CLI text).
  ExternalBackward(std::vector<LayerInfo> layers, const Precision& precision, const nlohmann::json& scaler,
                   const std::string& device = "cpu");
  ~ExternalBackward();
  // The caller's graph, once it knows it (the plug-in learns it from autograd at the first backward,
  // after the table was made): inputs[i] = the ids of the layers whose outputs layer i reads (-1: the
  // model's input), in any order, cycles allowed. With it an overflow at a place that is no controlled
  // layer's own (a weight gradient, a join, a non-parametric layer's gradient) is charged to the
  // controlled layers that set the scale it received, as for gradscale's own models (SPEC §6.5), not
  // to the loss scale. The scaler is bound again to the table, its state kept. Between iterations
  // only; ConfigError for a list of another length or an id outside the table.
  void set_layer_inputs(const std::vector<std::vector<int>>& inputs);
  // Data-parallel: `reducer` (borrowed; null: one process) reduces, over the ranks, every statistic a
  // scale is chosen from, as soon as it is computed — the controllers' queries (upstream), the loss
  // gradient S0 is chosen from, the parts' maxima of a join (join_target) — so that every rank takes the
  // same S0, local scales and join targets (lib/instrument/statistics_reducer.h). Every rank must then
  // make these calls in the same order.
  void set_reducer(StatisticsReducer* reducer) { reducer_ = reducer; }
  ExternalBackward(const ExternalBackward&) = delete;
  ExternalBackward& operator=(const ExternalBackward&) = delete;

  // ---- one iteration: begin_step, loss_gradient, then (in backward order) upstream / join /
  //      weight_gradient as the caller's engine reaches them, then finish_step ------------------------
  void begin_step(bool record_statistics = false);
  // The loss gradient: `g` holds n fp32 values at scale 1 (dL/d output, before any rounding). The first
  // call of an iteration chooses S0 (scaler.choose_loss_scale on these values, for policies that look);
  // every call multiplies g by S0 in fp32 and rounds it once to the gradient format, in place (SPEC §5,
  // "Loss"). Returns S0.
  double loss_gradient(float* g, std::int64_t n) { return loss_gradient(g, g, n); }
  // The same from `src` into `g` (src is left as it is): one pass fewer than copying it first. So are
  // the two-address forms of upstream, round_received and weight_gradient below.
  double loss_gradient(const float* src, float* g, std::int64_t n);
  // S0 of this iteration (NaN before loss_gradient). An S0 chosen on the device (loss_gradient_held)
  // is read there: the first read waits for the step's measurements so far.
  double loss_scale();
  // Step 2 of SPEC §5 at `layer`: `product` holds the fp32 gradient the layer sends upstream at scale
  // `scale_in` (its g·Wᵀ before rounding), in place → quantize(s·product); `grad` the gradient the
  // layer received (values in F at scale_in) and `weight` its working weight (values in F), each may be
  // null when the controller does not read them. A parametric layer's controller chooses s; others use
  // s = 1. Returns s (the gradient now carries s·scale_in).
  double upstream(int layer, float* product, const Shape& upstream_shape, const float* grad,
                  const Shape& grad_shape, const float* weight, const Shape& weight_shape, double scale_in) {
    return upstream(layer, product, product, upstream_shape, grad, grad_shape, weight, weight_shape, scale_in);
  }
  double upstream(int layer, const float* src, float* upstream, const Shape& upstream_shape, const float* grad,
                  const Shape& grad_shape, const float* weight, const Shape& weight_shape, double scale_in);
  // The join target of SPEC §5 for parts with these max|g_i| (NaN for a part holding one) and scales
  // (with a reducer, the maxima are first max-reduced over the ranks).
  double join_target(std::vector<double> max_abs, const std::vector<double>& scales);
  // The joined sum Σ g_i·T/S_i (fp32, computed by the caller) rounded once in place, at `layer`'s join
  // site (-1: a join outside every layer: found_inf is checked, no statistics are kept).
  void round_join(int layer, float* sum, std::int64_t n);
  // The gradient `layer` receives at its output, rounded in place to the gradient format (it may have
  // passed through fp32 operations that are no layer since it was last rounded): found_inf is checked
  // and charged to the layer; no statistics (they were taken where it was rounded before).
  void round_received(int layer, float* g, std::int64_t n) { round_received(layer, g, g, n); }
  void round_received(int layer, const float* src, float* g, std::int64_t n);
  // A weight-gradient part of `layer` (fp32, at scale `scale`), in place → quantize(r·g) / (r·scale) in
  // fp32: the true gradient, ready to be added to the master gradient (SPEC §4), with r the controller's
  // weight_grad_scale for the part (SPEC §6.5; 1 under a global policy; the record keeps the smallest),
  // chosen, with a reducer, from the part's maximum max-reduced over the ranks (every rank takes the
  // same r). layer -1: a parameter of no layer (rounded and unscaled, found_inf checked, no statistics).
  void weight_gradient(int layer, float* g, std::int64_t n, double scale) { weight_gradient(layer, g, g, n, scale); }
  void weight_gradient(int layer, const float* src, float* g, std::int64_t n, double scale);
  // Records that `layer` ran backward on a gradient at scale `scale_in` (its record's S_in).
  void note_layer(int layer, double scale_in);
  // What precision cost `layer`'s gradient sent upstream (`weight` false) or its weight gradients
  // (true) against the caller's fp32 shadow of the pass (lib/train/shadow.h; the plug-in's
  // Scaler(shadow=True)): into its record, and so into the trace.
  void note_shadow(int layer, bool weight, const ShadowMetrics& metrics);
  // ---- scales as handles: the same steps without waiting for a device --------------------------------
  // Every scale a gradient carries in an iteration may be held in the iteration's table and passed as a
  // handle: S0, s·S_in after a layer, a join's T, or a value the caller brings. Where the arrays are on
  // a device that keeps a scale table (ArrayOps::keeps_scales) and no reducer is set, a controller that
  // describes its decision as a rule (LayerController::device_rule) decides there, and so does a join
  // (up to ArrayOps::max_join_parts parts): their handles hold entries of the device's table, whose
  // values, the records they fill and the controller's accept() come with the step's measurements
  // (flush) — the caller never waits for a scale unless it asks for one's value. Elsewhere every
  // handle holds a host value and the steps are the double forms above, bit for bit. Handles last
  // until the next begin_step; ConfigError for one that is not in the table.
  ScaleHandle scale_handle(double value);
  // S of `h`, and the local s of the decision that made it (1 for every other handle): on a device,
  // the first read of a scale only the device knows waits for the step's measurements so far.
  double scale_value(ScaleHandle h);
  double local_value(ScaleHandle h);
  // loss_gradient with S0 held: returns its handle. Where the arrays are on a device that keeps a scale
  // table and no reducer is set, a scaler that describes S0 as a rule (Scaler::device_loss_rule) has it
  // chosen there from the gradient's statistics — no wait; its value (loss_scale()) and the scaler's
  // accept_loss_scale come with the step's measurements. Elsewhere loss_gradient above, held.
  ScaleHandle loss_gradient_held(const float* src, float* g, std::int64_t n);
  // upstream with S_in held: returns the handle of s·S_in.
  ScaleHandle upstream(int layer, const float* src, float* upstream, const Shape& upstream_shape,
                       const float* grad, const Shape& grad_shape, const float* weight,
                       const Shape& weight_shape, ScaleHandle scale_in);
  // The join target T of parts[k] (sizes[k] fp32 values at scale scales[k]), from their maxima: the
  // handle of T.
  ScaleHandle join(const std::vector<const float*>& parts, const std::vector<std::int64_t>& sizes,
                   const std::vector<ScaleHandle>& scales);
  // The joined sum where the arrays live: out = Σ parts[k]·float(T/S_k) from 0 (n values each).
  void sum_scaled_parts(const std::vector<const float*>& parts, const std::vector<ScaleHandle>& scales,
                        ScaleHandle target, float* out, std::int64_t n);
  void weight_gradient(int layer, const float* src, float* g, std::int64_t n, ScaleHandle scale);
  void note_layer(int layer, ScaleHandle scale_in);

  // ---- data-parallel: every rank takes the same verdict ---------------------------------------------
  // What the ranks must agree on before finish_step, as a fixed-size buffer (layers + 4 values) to be
  // summed over the ranks: found_inf, the first non-finite layer, popart_als's edge counts. After the
  // sum, agree() makes the monitor the group's: found_inf if any rank found one, the lowest layer id
  // any rank named first, the summed counts. Each rank's weight gradients are already true gradients
  // (divided by its own scales), so summing them over ranks mixes no scales even where the ranks'
  // local scales differ.
  std::vector<double> agreement_buffer();
  void agree(const std::vector<double>& summed);
  // The same for where the step overflowed (SPEC §6.5's charges and skip rule), 3 + 4 per layer values:
  // whether a stored value was not finite, the loss gradient's overflow and each layer's sites, with
  // their maxima. After the sum every rank has every rank's overflow sites, and as each maximum the sum
  // of the ranks' (at least the largest: a back-off sized from it is no smaller than any rank's, and
  // the same on every rank).
  std::vector<double> overflow_buffer();
  void agree_overflows(const std::vector<double>& summed);
  // The verdict: the controller's end_step, then scaler.update. `loss` is reported in the result.
  StepResult finish_step(double loss = 0);
  // Ends the iteration without a verdict (the caller's backward pass failed part-way): the scaler's state
  // and the step count are left as they were, the records of the partial pass are dropped at the next
  // begin_step. A no-op outside an iteration.
  void abandon_step();

  // ---- reading and state --------------------------------------------------------------------------
  // On a device the roundings' records (statistics, found_inf, maxima) are made in one piece when the
  // step's measurements are needed — agreement_buffer, overflow_buffer, finish_step (ArrayOps::flush):
  // read the monitor and the layer rows after those, as after every step.
  std::int64_t steps() const { return steps_; }
  const StepMonitor& monitor() const { return monitor_; }
  std::vector<LayerScale> layer_scales() const;
  const std::vector<LayerInfo>& layers() const { return layers_; }
  const Precision& precision() const { return precision_; }
  // The steps on the caller's arrays, in their memory (a GPU's when the device is one): also for the
  // caller's own roundings of forward values (quantize) and maxima (a join's parts).
  ArrayOps& arrays() { return *ops_; }
  const std::string& device() const { return device_; }
  // How many times the host has waited for the device so far (0 on the host): Backend::host_waits.
  std::int64_t host_waits() const { return backend_ ? backend_->host_waits() : 0; }
  Scaler& scaler() { return *scaler_; }
  // The header of a trace of this backward (lib/train/trace.h): make_trace_header with its formats and
  // scaler, `seed` and the caller's layer table `layers` (rows as Model::layer_table's, docs/trace.md),
  // `config` (an object describing the run) under "config".
  nlohmann::json trace_header(const nlohmann::json& config, std::uint64_t seed,
                              const nlohmann::json& layers) const;
  // {"steps", "scaler": {"config", "state"}, "layers": [names]}; restore_state refuses another scaler
  // configuration or layer table (ConfigError naming what differs).
  nlohmann::json state() const;
  void restore_state(const nlohmann::json& state);

 private:
  void check_layer(int layer, bool allow_none, const char* call) const;
  // A held scale: its value on the host (NaN while only the device knows it) and, for a decision, its
  // s; `entry` its place in the device's table since the last flush (-1: none).
  struct HeldScale {
    double scale = 0, local = 1;
    int entry = -1;
  };
  HeldScale& held(ScaleHandle h, const char* call);
  ScaleHandle hold(double scale, double local = 1);
  // S0·g rounded once at the loss site, queued (S0 the multiplier, or the s of a table entry).
  void round_loss_gradient(const float* src, float* g, std::int64_t n, const RoundingScales& scales);
  // A device entry: its values (and `then`, for the records) at the next flush. `local`: the handle's
  // local scale when it is not the entry's own (a layer with s = 1 passes S_in's entry on), else NaN.
  ScaleHandle hold_entry(int entry, std::function<void(const ScaleEntry&)> then = {},
                         double local = std::numeric_limits<double>::quiet_NaN());
  int entry_of(ScaleHandle h);  // its entry, made from its host value when it has none
  bool device_scales() const { return ops_->keeps_scales() && reducer_ == nullptr; }
  void flush_arrays();  // ops_->flush(): every held scale is then a host value, no entry is left
  // SPEC §6.5 on the device for a weight-gradient part of `layer` at S_in = `scale_entry` (the
  // controller's rule, bound u_max = `bound`): ArrayOps::queue_weight_gradient, r into the record.
  void queue_device_weight_gradient(int layer, const float* src, float* g, std::size_t n, double bound,
                                    int scale_entry);
  // The rounding of a gradient sent upstream (its maximum into the layer's record).
  void round_upstream(int layer, const float* src, float* upstream, std::size_t n, const RoundingScales& scales);
  nlohmann::json layer_names() const;

  std::vector<LayerInfo> layers_;
  Precision precision_;
  std::string device_;
  std::unique_ptr<Backend> backend_;  // the device's (null on the host)
  ArrayOps* ops_;
  std::unique_ptr<Scaler> scaler_;
  StatisticsReducer* reducer_ = nullptr;
  StepMonitor monitor_;
  std::vector<char> wgrad_seen_;  // per layer: a weight-gradient part was stored this step
  std::int64_t steps_ = 0;
  double loss_scale_;
  int loss_held_ = -1;  // the handle of this iteration's S0 once loss_gradient_held chose it (-1: none)
  bool in_step_ = false;
  std::vector<HeldScale> held_;  // this iteration's scale table
};

}  // namespace gradscale
