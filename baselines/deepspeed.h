// Policy `deepspeed`: DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py) with the
// defaults of DeepSpeed's fp16 configuration block, including its hysteresis ("delayed shift").
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (defaults of DeepSpeed's fp16 config: initial_scale_power 16, loss_scale_window 1000,
// min_loss_scale 1, hysteresis 2, consecutive_hysteresis false; the scale factor is fixed at 2):
//   init_scale              2^16   finite, > 0; a Python float, so kept in double
//   scale_window            1000   integer >= 1
//   min_scale               1      finite, > 0, <= init_scale
//   hysteresis              2      integer >= 1 (DeepSpeed's delayed_shift)
//   consecutive_hysteresis  false  refill the hysteresis on every clean step, not only on growth
//   raise_at_min            true   an overflow that would lower the scale below min_scale raises
//   legacy_growth           false  the growth rule of releases before 2025 (see below)
// Update (cur_iter counts every update; last_overflow_iter starts at -1):
//   I: if hysteresis == 1 or cur_hysteresis == 1: at min_scale with raise_at_min -> ScalerError (the
//      state is left as it was); else scale = max(scale / 2, min_scale). Otherwise cur_hysteresis -= 1.
//      last_overflow_iter = cur_iter; the step is skipped.
//   F: if consecutive_hysteresis: cur_hysteresis = hysteresis. Growth when stable = cur_iter -
//      last_overflow_iter - 1 is > 0 and a multiple of scale_window (legacy_growth: when cur_iter -
//      last_overflow_iter is a multiple of scale_window); on growth scale *= 2 and, if not consecutive,
//      cur_hysteresis = hysteresis.
//   Then cur_iter += 1.
// State: {"cur_scale": double, "cur_iter", "last_overflow_iter", "cur_hysteresis": integers}.
std::unique_ptr<Scaler> make_deepspeed_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
