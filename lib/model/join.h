// The backward join (SPEC §5): scaled gradients (g_i, S_i) arriving at one forked tensor are brought
// to one target scale T before they are summed, for every scaler and method.
#pragma once

#include <vector>

#include "lib/instrument/statistics_reducer.h"
#include "lib/layers/layer.h"

namespace gradscale {

// T = the largest S_i with 2·m·T < max_finite(F), where m = max_i(max|g_i| / S_i); if none qualifies,
// min S_i halved until it does. (The 2 keeps headroom for the sum.)
double join_target_scale(const std::vector<double>& max_abs, const std::vector<double>& scales, Format f);

// out = quantize(Σ g_i · T/S_i, F) at scale T; the sum is in fp32 and rounded once (round_gradient at the
// join site of `node_id`: statistics when recording, non-finite results reported). All parts must have
// the same shape. With a `reducer` (data-parallel training), the parts' max|g_i| are max-reduced over
// the ranks first, so every rank picks the T one process with the whole batch would.
void join_scaled_grads(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                       StepMonitor& monitor, int node_id, StatisticsReducer* reducer = nullptr);

}  // namespace gradscale
