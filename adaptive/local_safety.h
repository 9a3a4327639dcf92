// The local overflow safety of the per-layer policy (SPEC §6.5): a safety factor φ_l per layer and one
// for the loss scale, each backed off where an overflow happened and probed back up after clean steps.
//
// Charging. An overflow is charged to the scale that produced it:
// - the gradient a controlled layer sends upstream: that layer's own s, so φ_l (the controlled layers are
//   the parametric ones, or with "control_at": "all" every layer);
// - anything else at a layer — the gradient an uncontrolled layer sends upstream, a weight gradient, the
//   gradient joined at a layer's output — came from the scale the layer received, so it is charged to
//   the controlled layers that set that scale: following the graph towards the loss through the
//   layers that pass their scale on, every controlled consumer, or the loss scale when the loss's
//   gradient reaches the layer unchanged;
// - the loss gradient: the loss scale's φ (halved, as SPEC §6.4's global φ: S0 has its floor).
// Only overflows whose gradient came in finite are charged (a non-finite value downstream of the first
// one is its consequence, not a new cause): those with a finite fp32 maximum, and the first non-finite one.
//
// Back-off of a layer, sized: a charge with fp32 maximum m (before rounding, at the scale that overflowed)
// multiplies the factor by the largest power of two that brings m under u_max·2^-margin — one step,
// however far it overflowed — and by ½ when m is not finite. Several charges to one factor in a step:
// the smallest. Recovery: a factor below 1 doubles after `recover_every` steps in which it was not
// charged, never above 1.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/instrument/step_monitor.h"
#include "lib/scaler/controller.h"

namespace gradscale::adaptive {

class LocalSafety {
 public:
  // The layer table (its graph: LayerInfo::inputs, in any order) and which layers set a local scale:
  // the parametric ones, or every layer with `all_controlled`. Keeps the factors of layers that remain;
  // may be called again when the graph becomes known or changes.
  void bind(const std::vector<LayerInfo>& layers, bool all_controlled = false);
  // φ_l of a layer (1 for one the table does not have) and φ of the loss scale.
  double layer_factor(int layer_id) const;
  double loss_factor() const { return loss_.phi; }
  // After one iteration: charges its overflows (returns whether any was charged) and recovers the rest.
  bool update(const StepMonitor& monitor, double u_max, int margin, std::int64_t recover_every);
  // A plain halving of the loss scale's φ, for a step the policy knows only as found_inf (replay).
  void charge_loss_halving(std::int64_t recover_every);

  // {"phi", "clean_steps"} of the loss scale; per layer only where φ_l < 1.
  nlohmann::json loss_state() const { return {{"phi", loss_.phi}, {"clean_steps", loss_.clean}}; }
  nlohmann::json layer_state(int layer_id) const;  // null when the layer's φ is 1
  // From a policy state: the loss's factor, and a layer's (absent keys: 1 and 0).
  void restore_loss(double phi, std::int64_t clean);
  void restore_layer(int layer_id, double phi, std::int64_t clean);
  void clear_layers();

  // Who pays for an overflow of the gradient layer `id` received: the controlled layers that set its
  // scale, -1 for the loss (see above).
  const std::vector<int>& received_from(int id) const;
  // Whether a layer sets a local scale: parametric, or any with `all_controlled`.
  bool controlled(int layer_id) const;

 private:
  struct Factor {
    double phi = 1;
    std::int64_t clean = 0;
  };
  Factor& factor(int target) { return target < 0 ? loss_ : layers_[static_cast<std::size_t>(target)]; }

  std::vector<LayerInfo> table_;
  bool all_controlled_ = false;
  std::vector<std::vector<int>> charged_;  // received_from, per layer
  std::vector<Factor> layers_;
  Factor loss_;
};

// The back-off factor for an overflow whose fp32 maximum before rounding was `max_abs` (see above).
double back_off_factor(double max_abs, double u_max, int margin);

}  // namespace gradscale::adaptive
