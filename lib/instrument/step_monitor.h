// What one iteration's backward pass observed (SPEC §4, §8): found_inf and the first layer that
// produced a non-finite value, and per layer the scales it used and — on steps that record — the §3
// statistics of the gradients it rounded. The engine fills it (lib/layers/precision_ops.cpp, the only
// place gradients are rounded); controllers read it in their update, the trace writer writes it.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/instrument/histogram.h"

namespace gradscale {

// Where a gradient is rounded: the gradient a layer sends upstream, a joined gradient at a fork, a weight
// or bias gradient, or the loss gradient. Each site has its own slot in the monitor's records.
enum class GradSite : std::uint8_t { upstream, join, weight, loss };

// What precision cost one gradient of a layer against an fp32 shadow of the same backward pass
// (ScaledTraining::set_shadow, the plug-in's Scaler(shadow=True); docs/trace.md): the share of Σ|g|
// that rounded to zero (g: the fp32 values just before their rounding), ‖g_lp/S − g_fp32‖/‖g_fp32‖ and
// the cosine between the two (NaN where a norm is 0 and the other is not).
struct ShadowMetrics {
  double underflow_mass = 0;
  double rel_error = 0;
  double cosine = 1;
};

struct LayerRecord {
  int layer_id = -1;
  bool ran = false;             // the layer's backward ran this iteration
  double local_scale = 1.0;     // s the layer applied to the gradient it sent upstream
  double unbound_scale = 1.0;   // the controller's s before bounds and power of two
  int scale_limit = 0;          // what held s (ScaleLimit of lib/scaler/scale_rule.h; 0: the method)
  double scale_in = 1.0;        // S of the gradient the layer received
  double scale_out = 1.0;       // S of the gradient it sent upstream (s·S_in)
  bool sent_grad = false;       // it sent an activation gradient upstream
  float sent_max_abs = 0;       // max|g| of that gradient in fp32 before rounding (inf if not finite); always
  // Full statistics, taken only when the monitor records: the activation gradient sent upstream (fp32,
  // after s, before rounding), the weight and bias gradients (fp32 at S_in, before rounding, merged),
  // and the gradient joined at this layer's output when it feeds several layers.
  TensorStats activation_grad, weight_grad, joined_grad;
  bool has_activation_grad = false, has_weight_grad = false, has_joined_grad = false;
  // The factor r its weight and bias gradients were stored at (SPEC §6.5: rounded as r·xᵀg at scale
  // r·S_in, unscaled by r·S_in); 1 under a global policy.
  double weight_grad_scale = 1.0;
  // Overflows at this layer (SPEC §4's found_inf, by site): of the gradient it sent upstream, of its
  // weight gradients, of the gradient joined at its output; and the largest fp32 magnitude before
  // rounding among them (inf when one was not finite). Always kept.
  bool overflow_upstream = false, overflow_weight = false, overflow_join = false;
  float overflow_max_abs = 0;
  // Against the fp32 shadow, on the steps it ran: the gradient sent upstream, the weight gradients.
  bool has_shadow_upstream = false, has_shadow_weight = false;
  ShadowMetrics shadow_upstream, shadow_weight;
};

// Collects found_inf and per-layer records during one iteration. Passed explicitly.
struct StepMonitor {
  bool found_inf = false;
  int first_nonfinite_layer = -1;  // in backward order: the first layer that produced a non-finite value
  // Whether a value the update would use is not finite: a stored gradient that is inf or NaN (an
  // overflow that a saturating format clamped to its largest finite value is found_inf but not this), or
  // a scale that cannot be divided out. The per-layer policies skip on this (SPEC §6.5), the global
  // ones on found_inf.
  bool nonfinite_stored = false;
  // An overflow of the loss gradient (rounded at S0): charged to S0, not to a layer.
  bool loss_overflow = false;
  float loss_overflow_max_abs = 0;
  bool record = false;             // take full tensor_stats (trace steps, statistics-driven scalers)
  double gradient_edge = 0.0;      // > 0: count weight gradients about this edge (popart_als)
  std::uint64_t grad_below_edge = 0, grad_above_edge = 0;
  std::vector<LayerRecord> records;  // indexed by layer id
  // The loss gradient (SPEC §5: fp32 times S0, rounded to F): its max|g| always, its statistics when recording.
  float loss_grad_max_abs = 0;
  TensorStats loss_grad;
  bool has_loss_grad = false;
  // The loss of the iteration (mean cross-entropy over the batch) and its correct count, filled by the
  // backend that computed it (Backend::loss_backward; a device backend at finish_backward).
  double loss = 0;
  std::int64_t correct = 0;
  double scaler_seconds = 0;  // wall time spent in controllers and the statistics they asked for

  // Clears everything for an iteration of a model with `num_layers` layers.
  void reset(int num_layers, bool record_stats, double edge);
  // found_inf from `layer_id` (the first one is kept), with nothing known of where: also marks the
  // step's stored values non-finite (a scale that cannot be divided out, an outside engine's report).
  void note_nonfinite(int layer_id);
  // An overflow at a rounding site of `node`: found_inf, the layer's record (or the loss's, whatever
  // `node`), and whether the stored value is not finite.
  void note_overflow(GradSite site, int node, float max_abs_before, bool stored_nonfinite);
  LayerRecord& record_of(int layer_id);
};

}  // namespace gradscale
