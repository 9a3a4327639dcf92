// Policy `megatron`: Megatron-LM's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py) with the
// defaults of Megatron-LM's command line (--initial-loss-scale 2^32, --min-loss-scale 1,
// --loss-scale-window 1000, --hysteresis 2; growth 2 and backoff 0.5 as its optimizer setup passes).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (all scales and factors are float32 tensors in Megatron, so float32 here):
//   initial_scale    2^32  finite, > 0
//   min_scale        1     finite, > 0, <= initial_scale
//   growth_factor    2     > 1
//   backoff_factor   0.5   in (0, 1)
//   growth_interval  1000  integer >= 1
//   hysteresis       2     integer >= 1
// Update:
//   I: growth_tracker = 0; hysteresis_tracker -= 1; if hysteresis_tracker <= 0:
//      scale = max(scale * backoff_factor, min_scale). The step is skipped. (The hysteresis tracker is
//      refilled only on growth, so it counts overflows since the last growth and may go negative.)
//   F: growth_tracker += 1; if growth_tracker == growth_interval: growth_tracker = 0,
//      hysteresis_tracker = hysteresis, scale = scale * growth_factor. Megatron does not guard this
//      product: a scale grown past the float32 range becomes inf, exactly as in Megatron.
// State: {"scale": float32, "growth_tracker", "hysteresis_tracker": integers}.
std::unique_ptr<Scaler> make_megatron_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
