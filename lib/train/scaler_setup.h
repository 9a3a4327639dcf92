// The scaler a training driver runs, built in one place: ScaledTraining (gradscale's own layers) and
// ExternalBackward (a backward pass another engine computes) both construct theirs from a config here.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/layers/layer.h"
#include "lib/scaler/scaler.h"

namespace gradscale {

// make_scaler for a run at `precision`: `config` is {"policy": NAME, ...} or one of its text forms
// ("torch", ...). Scalers size themselves for the format they scale: the gradients'
// (Precision::gradient_format). Throws ConfigError as make_scaler does; the caller owns the result.
std::unique_ptr<Scaler> make_scaler_for(const nlohmann::json& config, const Precision& precision);

}  // namespace gradscale
