// Policy `torch`: PyTorch's GradScaler (torch.amp.GradScaler and its update kernel
// `_amp_update_scale_`), the dynamic loss scale most PyTorch mixed-precision training uses.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (PyTorch's names and defaults):
//   init_scale       2^16  finite, > 0; held in float32 (PyTorch keeps the scale in a float32 tensor)
//   growth_factor    2     > 1        (a Python float: kept in double)
//   backoff_factor   0.5   in (0, 1)  (likewise)
//   growth_interval  2000  integer >= 1 (int32 in PyTorch)
// Update, as the kernel does it: products are formed in double and rounded once to float32.
//   I: scale = f32(scale * backoff_factor), growth_tracker = 0; the step is skipped. No floor.
//   F: t = growth_tracker + 1; if t == growth_interval: s = f32(scale * growth_factor), kept only if
//      finite (the scale never grows to inf), growth_tracker = 0; else growth_tracker = t.
// State: {"scale": float32, "growth_tracker": integer}.
std::unique_ptr<Scaler> make_torch_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
