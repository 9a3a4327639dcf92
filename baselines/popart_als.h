// Policy `popart_als`: Graphcore PopART's automatic loss scaling (the AutomaticLossScale transform and
// its LossScaleUpdate op). Global and statistics-driven: the scale follows a two-bin histogram of the
// weight-layer gradients, not overflow events.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (PopART's automaticLossScalingSettings; all float32 as in PopART):
//   initial_scale  1       finite, >= 1: the optimizer's lossScaling (PopART's SGD default is 1)
//   bin_edge       1/16    in (0, 1]: binEdgeLocation; the histogram edge is bin_edge * max_finite(F)
//   threshold      1e-7    in [0, 1]: thresholdUpperCountProportion
//   update_period  1       integer >= 1: updatePeriod
//   max_scale      2^floor(log2 max_finite(F))  finite, >= 1 (fp16: 2^15, the clip PopART applies;
//                          fp8_e5m2: 2^15, fp8_e4m3: 2^8, bf16 and fp32: 2^127)
// Statistics: gradient_edge() = bin_edge * max_finite(F) in the units of the stored (scaled) weight
// gradients; the trainer fills StepStatistics::grad_below_edge / grad_above_edge with
// count_about_edge() (lib/instrument/histogram.h) over all weight-layer gradients.
// Update: counter = (counter + 1) mod update_period (it starts at -1, so the first step updates); when
// counter == 0 (statistics of other steps are not used, as in PopART):
//   factor = factor * 0.5 if above > (threshold / (1 - threshold)) * below (PopART's float32 form of
//   above / (above + below) > threshold), else factor * 2;
//   factor = min(factor, max_scale / initial_scale) (PopART's clip), then
//   factor = max(factor, 1 / initial_scale) (SPEC's floor of 1).
// The scale is initial_scale * factor (float32). PopART never skips; gradscale skips a step with
// found_inf (as under every policy: the update would write inf/NaN into the weights). The scale still
// follows the counts on that step, where an inf counts above the edge.
// State: {"loss_scale_update_factor": float32, "counter": integer} (PopART's tensors).
std::unique_ptr<Scaler> make_popart_als_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
