// The adaptive policy's derived bounds (SPEC §6.6, `"bounds": "derived"`; docs/scalers.md, "Bounds"):
// the accumulated scale a controlled layer sends upstream is bounded by the magnitudes measured at the
// rounding points that scale reaches and no controller governs, instead of the reference's constant
// accum_upper_bound.
//
// Which points: a controlled layer l sets the scale of the gradient it sends upstream. Until the next
// controlled layer, that gradient passes through layers that pass their scale on (BatchNorm, pooling,
// ReLU, Flatten, a join at a fork, ...), and each of them rounds what it sends upstream to the gradient
// format at that scale: those layers are the ones whose overflows local safety charges to l
// (LocalSafety::received_from). After every step with records, D_l is the largest unscaled magnitude
// those layers sent, max(sent_max_abs / S_out) over the ones that ran (fp32, before rounding; a
// non-finite maximum is the overflow local safety backs off, not a magnitude, and is left out). The
// next steps bound l's accumulated scale so that a value of that size keeps `margin` bits of headroom:
//
//     S_out = s·S_in ≤ B_l = u_max·2^-margin / D_l          (no bound while D_l is unknown or 0)
//
// The other rounding points need no accumulated bound: the gradient l itself sends is capped by its
// method (measured: max|s·o| ≤ u_max·2^-margin, exactly, on this step's values), every weight gradient by
// its factor r (SPEC §6.5, exact), and a join chooses its own target so that the sum fits (SPEC §5). B_l
// is a prediction from the last step: exact while those magnitudes grow by less than 2^margin from one
// step to the next (a BatchNorm's gradient is linear in its input gradient, with factors from the
// forward); a larger jump is an overflow that local safety charges to l and backs off in one step.
// With "control_at": "all" every layer is controlled, so no layer passes a scale on and no bound remains:
// every rounding point has its own scale.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "adaptive/local_safety.h"
#include "lib/instrument/step_monitor.h"

namespace gradscale::adaptive {

class DerivedBounds {
 public:
  // Forgets every measurement; `n` layers.
  void reset(std::size_t n) { downstream_.assign(n, 0.0); }
  // After a step with records: D_l of each controlled layer whose pass-through layers ran (the others
  // keep theirs). `graph` says who sets the scale each layer received.
  void observe(const StepMonitor& monitor, const LocalSafety& graph);
  // B_l, the bound on the scale layer `layer_id` sends upstream: +inf while D_l is unknown or 0.
  double accum_bound(int layer_id, double u_max, int margin) const;
  // D_l (0: unknown), for the state and the trace.
  double downstream_max(int layer_id) const;
  void restore(int layer_id, double downstream_max);

 private:
  std::vector<double> downstream_;  // D_l per layer, 0 = none measured
};

}  // namespace gradscale::adaptive
