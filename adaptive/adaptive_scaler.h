// Policy `adaptive`: the paper's per-layer loss scaling (SPEC §6) behind the controller contract of
// lib/scaler/controller.h. One object plays both roles: the loss-level policy (S0 = φ·init_scale, or
// chosen every step from the loss gradient with init_scale "auto", never below its floor; the local
// safety of §6.5) and the per-layer controller (a Method computes the unbound s, recomputed every
// update_every steps per layer and cached between; the bounds of §6.1 and the power of two follow).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::adaptive {

// Parameters ({"policy": "adaptive", ...}; docs/scalers.md):
//   method             approx_range | abs_range | element_wise | fixed | measured   (approx_range)
//   n_uf               (0, 0.5)     target underflow fraction                          (1e-3)
//   scale_upper_bound  > 0          s ≤ this                                           (16)
//   accum_upper_bound  > 0          s ≤ this / S_in                                    (1024)
//   bounds             reference | derived: the two constants above, or s·S_in ≤ u_max·2^-margin / D_l
//                                   from the magnitudes measured downstream (derived_bounds.h) (reference)
//   power_of_two       bool         s = 2^floor(log2 s)                                (true)
//   update_every       >= 1         statistics recomputed every N steps per layer      (1)
//   relu_factor        (0, 1]       approx_range: fraction of non-zero products        (0.5)
//   init_scale         > 0 | "auto" S0 before φ                                        (1)
//   cast_form          no_weight | lognormal | measured: how "auto" chooses S0 from the   (no_weight)
//                      fp32 loss gradient (measured: SPEC §6.3's rule on its exact values)
//   recover_every      >= 1         clean steps before a safety factor doubles back (≤ 1) (50)
//   fixed_scale        > 0          fixed: the local scale                             (1)
//   margin             [0, 64]      measured: bits of headroom below u_max             (4)
//   u_min, u_max       > 0          representable range (default: the gradient format's min subnormal, max finite)
//   controller         a name       a registered LayerController decides the local scales instead of
//                                   `method` (register_controller); then the method's keys are refused
//   controller_config  object       what that controller's factory gets                  ({})
// Safety (SPEC §6.5, adaptive/local_safety.h): overflows are charged where they happened — a layer's φ_l
// multiplies its s after the bounds, the loss scale's φ multiplies S0 — and S0 never goes below its floor
// (§6.3's rule on the exact fp32 loss gradient); weight gradients are stored at their own factor r
// (LayerController::weight_grad_scale, u_max the bound); a step is skipped only when a stored value is
// not finite. Under a registered controller the policy keeps SPEC §6.4 (skip on found_inf, φ halves,
// passed to the controller in begin_step) and the S0 floor; φ_l and r are the built-in methods'.
// State: {"phi", "clean_steps" (the loss scale's factor), "last_loss_scale", "loss_floor", "layers":
// [{"id", "computed_at", "unbound", "phi", "clean_steps" where φ_l < 1, and "downstream_max" (D_l) where
// known under "bounds": "derived"}, ...]}, and "controller":
// the controller's own state when one is configured.
std::unique_ptr<Scaler> make_adaptive_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::adaptive
