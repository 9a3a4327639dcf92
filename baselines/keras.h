// Policy `keras`: the dynamic loss scale of tf-keras' LossScaleOptimizer (the _DynamicLossScaleState of
// keras/mixed_precision/loss_scale_optimizer.py), with its defaults.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (the loss scale is a float32 variable; the multiplier is fixed at 2, the floor at 1):
//   initial_scale  2^15  finite, >= 1 (the floor)
//   growth_steps   2000  integer >= 1 (dynamic_growth_steps)
// Update:
//   F: if good_steps + 1 >= growth_steps: scale = scale * 2 if that is finite (else unchanged),
//      good_steps = 0; else good_steps += 1.
//   I: scale = max(scale / 2, 1), good_steps = 0; the step is skipped.
// State: {"current_loss_scale": float32, "good_steps": integer} (tf-keras' variable names).
std::unique_ptr<Scaler> make_keras_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
