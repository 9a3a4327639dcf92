// The backward join (SPEC §5): scaled gradients (g_i, S_i) arriving at one forked tensor are brought
// to one target scale T before they are summed, for every scaler and method.
#pragma once

#include <cstddef>
#include <vector>

#include "lib/instrument/statistics_reducer.h"
#include "lib/layers/layer.h"

namespace gradscale {

// T = the largest S_i with 2·m·T < max_finite(F), where m = max_i(max|g_i| / S_i); if none qualifies,
// min S_i halved until it does. (The 2 keeps headroom for the sum.)
double join_target_scale(const std::vector<double>& max_abs, const std::vector<double>& scales, Format f);

// out[i] = Σ_k parts[k][i] · float(target / scales[k]) for i < n: each factor rounded to float once, each
// term one fp32 product added in fp32 to a sum that starts from 0, the parts in the order given (SPEC §5's
// join before its one rounding; lib/cuda's scale_add is the same step on a device). Host memory: `count`
// parts of n values each and `out` (n values, overwritten), which must not overlap a part. The loop
// join_scaled_grads runs and the PyTorch plug-in's joins call (gradscale._core.sum_scaled_parts).
void sum_scaled_parts(const float* const* parts, const double* scales, std::size_t count, double target,
                      float* out, std::size_t n);

// out = quantize(Σ g_i · T/S_i, F) at scale T; the sum is in fp32 and rounded once (round_gradient at the
// join site of `node_id`: statistics when recording, non-finite results reported). All parts must have
// the same shape. With a `reducer` (data-parallel training), the parts' max|g_i| are max-reduced over
// the ranks first, so every rank picks the T one process with the whole batch would.
void join_scaled_grads(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                       StepMonitor& monitor, int node_id, StatisticsReducer* reducer = nullptr);

}  // namespace gradscale
