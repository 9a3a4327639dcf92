// Policy `apex`: NVIDIA Apex's dynamic LossScaler (apex/amp/scaler.py, the scaler behind
// amp.initialize(loss_scale="dynamic")), with its defaults.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (Apex keeps the scale in a Python float, so in double here):
//   init_scale    2^16  finite, > 0; the first scale is min(init_scale, max_scale), as in Apex
//   scale_window  2000  integer >= 1
//   min_scale     null  null (no floor) or finite > 0, <= min(init_scale, max_scale)
//   max_scale     2^24  finite, > 0
// Update:
//   I: scale = max(min_scale, scale / 2) (scale / 2 without a floor), unskipped = 0; the step is skipped.
//   F: unskipped += 1.
//   Then, if unskipped == scale_window: scale = min(max_scale, scale * 2), unskipped = 0.
// State: {"loss_scale": double, "unskipped": integer} (the keys of Apex's amp.state_dict()).
std::unique_ptr<Scaler> make_apex_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
