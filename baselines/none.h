// Policy `none`: no loss scaling (S = 1), the fp32 reference and the "what underflows without
// scaling" baseline. A step with found_inf is still skipped, as under every gradscale policy.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters: none. State: {} (no counters). Update: skipped = found_inf; S stays 1.
std::unique_ptr<Scaler> make_none_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
