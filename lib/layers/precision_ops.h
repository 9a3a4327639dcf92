// The steps of the precision model every layer shares (SPEC §4–§5, §6.5), implemented once in
// precision_ops.cpp: the one rounding of a gradient to the gradient format with its found_inf check and
// statistics, and the CPU layers' local-scale and weight-gradient steps, which drive the per-layer rules
// of scale_step.h — the rules the CUDA backend's twins (lib/cuda/backend.h) and ExternalBackward drive too.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>

#include "lib/instrument/histogram.h"
#include "lib/instrument/log_moments.h"
#include "lib/instrument/product_range.h"
#include "lib/instrument/statistics_reducer.h"
#include "lib/instrument/step_monitor.h"
#include "lib/layers/layer.h"
#include "lib/numeric/quantize.h"
#include "lib/optim/parameter.h"
#include "lib/scaler/controller.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

// The one rounding of a gradient (SPEC §4–§5): d[0..n) ← quantize(multiplier · d, gradient format), with
// the multiplier (a local scale or S0) applied in fp32 before the one rounding. When the monitor
// records, the §3 statistics of the fp32 values (after the multiplier) go to the site's slot of `node`'s
// record (weight gradients merge over weight and bias). A non-finite result, or — for a saturating
// format — a value at or beyond the overflow threshold before rounding, sets found_inf under `node`.
// Returns max|d| before rounding (the fp32 values after the multiplier; inf when something is not finite).
float round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node, const Precision& p,
                     StepMonitor& monitor);
// The same from `src` into `d` (src may be d; src is left as it is): d ← quantize(multiplier · src), the
// same records and bits, without a pass that first copies src into d.
float round_gradient(const float* src, float* d, std::size_t n, float multiplier, GradSite site, int node,
                     const Precision& p, StepMonitor& monitor);
// The two records round_gradient makes, for a backend that measures on a device and fills the monitor
// afterwards: the statistics of a rounding into the site's slot of `node`'s record (weight gradients
// merge over weight and bias), and the found_inf check from max|d| before rounding (`quantized`: the
// values are rounded to the gradient format, i.e. not a weight gradient kept in fp32).
void store_gradient_statistics(StepMonitor& monitor, GradSite site, int node, const TensorStats& stats);
void check_rounded_max(StepMonitor& monitor, GradSite site, int node, float max_abs_before, bool quantized,
                       const Precision& p);
// Rounds `t` (an fp32 activation gradient a non-parametric layer sends upstream, at an unchanged scale)
// in place to the gradient format: round_gradient at the upstream site with multiplier 1.
void round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor);
// The gradient a layer without a GEMM sends upstream (SPEC §5): `gx.g` holds it in fp32 at the scale S
// of `grad_output`. When the scaler's controller acts at this layer (LayerController::acts_at), it is
// asked for a local scale s as a parametric layer is (scale_upstream_grad with no weight, K = 0), s·gx.g
// is rounded once and gx.scale = s·S. Otherwise gx.scale = S, and gx.g is rounded to the gradient
// format when `rounds` (values the layer computed: averages, BatchNorm, dropout's 1/(1−p)) or passed on
// as it is (ReLU, Flatten, Add and non-overlapping max pooling move values already in the format).
void send_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, ScaledGrad& gx, BackwardContext& ctx,
                        bool rounds);
// Rounds a forward output in place to F.
void round_output(Tensor& t, const Precision& p);
// working = quantize(master, F): the per-step working copy of a parameter (SPEC §4).
void round_working_copy(const Parameter& master, Tensor& working, const Precision& p);
// SPEC §5 steps 1–2 of a parametric layer: `gx.g` holds the fp32 upstream product g ⊗ Wᵀ at the scale S
// of `grad_output`. Asks the scaler's controller (if any) which statistics it needs, computes them
// (lib/instrument), gets s, and rounds s·gx.g once (round_gradient); sets gx.scale = s·S.
void scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, const UpstreamProduct& product,
                         ScaledGrad& gx, BackwardContext& ctx);
// The query of step 1 at a gradscale layer (its raw views set only when the data is in host memory; no
// statistics yet), for the step itself (decide_local_scale, lib/layers/scale_step.h), which the CUDA
// backend's host decisions share.
LocalScaleQuery upstream_query(const Layer& layer, const ScaledGrad& grad_output,
                               const UpstreamProduct& product, const Tensor& upstream,
                               const BackwardContext& ctx);
// Weight-gradient step (SPEC §4, §6.5): `g` is the fp32 gradient at scale S; it is multiplied by
// `factor` (r, a power of two), rounded to the gradient format (unless the precision keeps weight
// gradients in fp32), checked for non-finite values, counted about the monitor's edge, and g/(r·S) is
// added to `param.grad`.
// With a `reducer` (data-parallel), g is first summed over the ranks, so the whole batch's gradient is
// what is rounded, checked and applied.
void accumulate_weight_grad(Tensor& g, double scale, Parameter& param, int layer_id, const Precision& p,
                            StepMonitor& monitor, double factor = 1.0, StatisticsReducer* reducer = nullptr);
// The weight-gradient step of one layer: `grads` are its parameters' fp32 gradients at the scale S it
// received (summed over the ranks first, with the context's reducer). Under a per-layer policy (and
// weight gradients rounded), its controller chooses a factor r for each of them from its largest
// magnitude (checked_weight_grad_scale, lib/layers/scale_step.h; 1 otherwise), and each goes through
// accumulate_weight_grad at its r; the layer's record keeps the smallest r.
struct WeightGrad {
  Tensor* grad;
  Parameter* param;
};
void accumulate_weight_grads(const Layer& layer, std::initializer_list<WeightGrad> grads, double scale,
                             BackwardContext& ctx);
// The statistics a controller asked for (StatNeeds), computed once with lib/instrument on the query's raw
// views; attach() computes them and points the query at them (this object must outlive the query's use).
struct QueryStatistics {
  TensorStats grad_moments, weight_moments, upstream_stats;
  ProductRange products;
  LogMoments grad_log_moments;
  void attach(StatNeeds needs, LocalScaleQuery& q, RoundOptions round,
              const std::function<ProductRange()>& product_range = nullptr);
  // Data-parallel training: reduces what attach() computed over the ranks (the weight's moments are
  // the same on every rank), and withdraws the raw views of this rank's rows (grad, upstream), which
  // are not the whole batch's: a controller decides from the reduced statistics only.
  void reduce(StatisticsReducer& reducer, LocalScaleQuery& q);
};
// Marks the start of a layer's backward in the monitor: it ran, and received a gradient at scale S_in.
void note_backward(int layer_id, double scale_in, StepMonitor& monitor);
// ShapeError "layer 'name': output gradient [..] does not match output [..]" unless the output gradient
// has the shape of the layer's output (the check of a backward that reads both; CPU layers and twins).
void check_output_grad(const Layer& layer, const Tensor& grad_output, const Tensor& output);

}  // namespace gradscale
