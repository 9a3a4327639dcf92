// Policy `te_delayed`: NVIDIA Transformer Engine's delayed scaling (recipe.DelayedScaling), the
// per-layer peer of the adaptive controllers. Each cast gradient keeps a history of its true amax; the
// scale used in an iteration comes from the history of the previous ones ("delayed").
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (Transformer Engine's names and defaults):
//   margin             0      integer >= 0: scale = (max_finite / amax) / 2^margin
//   amax_history_len   1024   integer >= 1
//   amax_compute_algo  "max"  "max" (of the history) or "most_recent"
// Targets: the loss gradient and the activation gradient each parametric layer sends upstream. For
// each, after every iteration the true amax (max|g| before rounding, divided by its scale) is pushed
// into the history, then scale = (max_finite(F) / amax_est) / 2^margin, kept unchanged when amax_est
// is zero or not finite (TE's torch.where on amax > 0 and isfinite). The scale is absolute: S0 is the
// loss gradient's, and a layer's local scale is s = scale / S_in, so the gradient it sends carries S =
// scale. Not a power of two, as in TE. found_inf skips the step (TE leaves skipping to the framework's
// loss scaler; here it is done so that non-finite gradients never reach the weights).
// State: {"targets": [{"id", "scale", "history": [...oldest first; null = inf]}, ...]} (id -1 = the loss).
std::unique_ptr<Scaler> make_te_delayed_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
