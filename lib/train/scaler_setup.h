// The scaler a training driver runs, built and checked in one place: ScaledTraining (gradscale's own
// layers) and ExternalBackward (a backward pass another engine computes) both construct theirs from a
// config here, and both refuse here a controller that acts where they cannot take a local scale.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/layers/layer.h"
#include "lib/scaler/scaler.h"

namespace gradscale {

// make_scaler for a run at `precision`: `config` is {"policy": NAME, ...} or one of its text forms
// ("torch", ...). Scalers size themselves for the format they scale: the gradients'
// (Precision::gradient_format). Throws ConfigError as make_scaler does; the caller owns the result.
std::unique_ptr<Scaler> make_scaler_for(const nlohmann::json& config, const Precision& precision);

// For a driver that takes local scales at parametric layers (Linear, Conv2d) only: ConfigError unless
// the controller of `scaler` (bound to `layers`) acts at none of the others (LayerController::acts_at,
// "control_at": "all"). The message starts with `driver`, names the first such layer and its kind, and
// ends with `reason` (why the driver cannot, and what to use instead). No controller: nothing to check.
void refuse_controller_off_gemm(Scaler& scaler, const std::vector<LayerInfo>& layers, const std::string& driver,
                                const std::string& reason);

}  // namespace gradscale
