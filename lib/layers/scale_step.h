// The two per-layer steps of the per-layer policies, written once for the three drivers that run them —
// the CPU layers (precision_ops.cpp), the CUDA backend (lib/cuda/backend_rounding.cpp) and a backward
// computed elsewhere (lib/train/external_backward.cpp): SPEC §5's local scale s and §6.5's factor r.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>

#include "lib/instrument/statistics_reducer.h"
#include "lib/instrument/step_monitor.h"
#include "lib/layers/precision_ops.h"
#include "lib/layers/upstream_decision.h"
#include "lib/numeric/quantize.h"
#include "lib/scaler/controller.h"

namespace gradscale {

class Scaler;

// ---- SPEC §5 steps 1–2: the local scale s ----------------------------------------------------------
// A driver's part of step 1: computes the statistics the controller asked for (`needs`) into `stats`
// from the data `q` describes, wherever that data is (host views, a device's batched copy), and points
// `q` at them (QueryStatistics::attach's contract). It may refuse a need it cannot meet (throws).
using AttachStatistics = std::function<void(StatNeeds needs, QueryStatistics& stats, LocalScaleQuery& q)>;

// Step 1: the controller's decision on the query `q` (upstream_query's, S_in and raw views set by the
// driver): the statistics it needs at q.layer_id through `attach`, reduced over the ranks when there is a
// `reducer` (data-parallel: every rank decides on the whole batch's), then controller.decide(q),
// checked (check_local_scale); the time since `start` is added to the monitor's scaler_seconds.
LocalScale decide_local_scale(LayerController& controller, LocalScaleQuery q, const AttachStatistics& attach,
                              StatisticsReducer* reducer, std::string_view policy, StepMonitor& monitor,
                              std::chrono::steady_clock::time_point start);

// NumericError "the controller of policy '<policy>' chose local scale <s> at layer '<name>' (must be
// finite and > 0)" unless s is finite and > 0: the check of every decision, the host's or a device's.
void check_local_scale(double s, std::string_view policy, std::string_view layer_name);

// Step 2, after the decision (LocalScale{} — s = 1 — under a global policy): `layer_id`'s record takes
// s, its unbound value and its limit and notes a gradient sent; `round` then rounds s·o once in the
// driver's memory, called once with the multiplier float(s) (s multiplies the fp32 accumulator before
// the one rounding, so s·o itself never overflows); last, the record's S_out = s·S_in. Returns s·S_in.
// `scale_in` NaN: S_in is a device value the host does not know yet, and S_out is left to the driver,
// which fills it when the value arrives.
double send_at_local_scale(StepMonitor& monitor, int layer_id, const LocalScale& decision, double scale_in,
                           const std::function<void(float multiplier)>& round);

// ---- SPEC §6.5: the weight-gradient factor r ---------------------------------------------------------
// The controller that chooses r in this step: the scaler's per-layer controller when it scales weight
// gradients (LayerController::scales_weight_grads) and they are rounded to the gradient format; null
// otherwise (r = 1: a global policy, a controller that does not, fp32 weight gradients).
LayerController* weight_grad_controller(Scaler& scaler, const Precision& p);

// r for a weight gradient of layer `layer_id` whose largest fp32 magnitude at S_in = `scale_in` is
// `max_abs` (inf when a value is not finite): controller.weight_grad_scale, checked — NumericError "the
// controller of policy '<policy>' chose weight-gradient scale <r> at layer '<name>' (must be a finite
// power of two > 0)" unless it is one.
double checked_weight_grad_scale(LayerController& controller, int layer_id, std::string_view layer_name,
                                 std::int64_t step, Format format, double scale_in, double max_abs,
                                 std::string_view policy);

// The record keeps the smallest r among a layer's weight-gradient parts in one step: r itself for the
// layer's `first` part, min(kept, r) after it.
void keep_smallest_weight_grad_scale(LayerRecord& record, double r, bool first);

}  // namespace gradscale
