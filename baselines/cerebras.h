// Policy `cerebras`: the dynamic loss scaling of Cerebras' PyTorch GradScaler
// (cerebras.pytorch.amp.GradScaler, update_scale), with its float16 defaults.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (the scale is a float32 tensor; the overflow ratio is compared in float32):
//   init_scale          2^15   finite, > 0; the first scale is min(init_scale, max_scale), as in cstorch
//   steps_per_increase  2000   integer >= 1
//   min_scale           2^-14  finite, >= 2^-14 (cstorch rejects smaller), <= min(init_scale, max_scale)
//   max_scale           2^15   finite (cstorch's default for float16 and bfloat16)
//   overflow_tolerance  0      in [0, 1): the fraction of overflowing steps since the last rescale
//                              that is tolerated (>= 1 would never lower the scale)
// Update, every step (counters since the last rescale):
//   steps += 1; overflows += I;
//   if overflows / steps > overflow_tolerance: scale /= 2, steps = overflows = 0;
//   then if steps > steps_per_increase: scale *= 2, steps = overflows = 0;
//   then scale is clamped to [min_scale, max_scale]. A step with found_inf is skipped (cstorch's
//   step_if_finite) and counted in num_skipped_steps.
// State: {"loss_scale": float32, "steps_since_rescale", "overflows_since_rescale",
//         "num_skipped_steps": integers} (cstorch's state_dict keys).
std::unique_ptr<Scaler> make_cerebras_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
