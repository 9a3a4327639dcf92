// Policy `static`: a constant loss scale S chosen by the user (the "static loss scaling" of Apex,
// DeepSpeed and Megatron). A step with found_inf is skipped; S never changes.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters: scale (required, finite, > 0; kept in double like every accumulated scale, SPEC §5).
// State: {} (no counters). Update: skipped = found_inf; S unchanged. Command-line form: static:S.
std::unique_ptr<Scaler> make_static_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
