// The device's decisions as device functions, for one thread: the statistics kernel's last block calls
// them (stats.cu, tensor_stats with a StatsDecision), and local_scale.cu's decide_local_scale kernel the
// first (a formula that reads no statistics), so a decision has one implementation wherever it is taken.
// Each evaluates lib/scaler/scale_rule.h's host function on the device's statistics.
#pragma once

#if !defined(__CUDACC__)
#error "lib/cuda/decide.cuh holds device code: include it from .cu files only"
#endif

#include <cmath>
#include <cstdint>

#include "lib/cuda/local_scale.h"

namespace gradscale::cuda::device {

__device__ inline RuleMoments moments_of(const DeviceStats* s) {
  if (s == nullptr) return RuleMoments{};
  return RuleMoments{static_cast<double>(s->count), s->sum, s->sum_squares, s->min, s->max, s->max_abs,
                     s->min_nonzero_abs};
}

// decide_local_scale: *out ← {s·S_in, s, unbound, limit} from evaluate_rule on the statistics given.
__device__ inline void decide_local(const ScaleRule& rule, const DeviceStats* grad, const DeviceStats* weight,
                                    const DeviceStats* upstream, const DeviceScale* in, DeviceScale* out) {
  RuleInputs inputs;
  inputs.grad = moments_of(grad);
  inputs.weight = moments_of(weight);
  if (upstream != nullptr) {
    // DeviceStats' bins are unsigned long long, TensorStats' std::uint64_t: the same 64-bit counts.
    static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t), "64-bit bins");
    inputs.upstream_bins = reinterpret_cast<const std::uint64_t*>(upstream->binades);
    inputs.upstream_nonzero = upstream->elements - upstream->zero - upstream->nonfinite;
    inputs.upstream_max_abs = upstream->max_abs;
  }
  inputs.scale_in = in->scale;
  const RuleDecision d = evaluate_rule(rule, inputs);
  *out = DeviceScale{d.s * inputs.scale_in, d.s, d.unbound, static_cast<double>(d.limit)};
}

// *out ← {r·S_in, r, r}: SPEC §6.5's weight-gradient factor r = weight_grad_range_scale(m, u_max, S_in)
// with m the largest max_abs of `count` statistics (infinite when one of them counted a non-finite value).
__device__ inline void decide_weight_grad_of(double m, double u_max, const DeviceScale* in, DeviceScale* out) {
  const double r = weight_grad_range_scale(m, u_max, in->scale);
  *out = DeviceScale{r * in->scale, r, r};
}
__device__ inline void decide_weight_grad(const DeviceStats* stats, int count, double u_max, const DeviceScale* in,
                                          DeviceScale* out) {
  double m = 0;
  for (int i = 0; i < count; ++i) m = stats[i].nonfinite > 0 ? INFINITY : rule_max(m, stats[i].max_abs);
  decide_weight_grad_of(m, u_max, in, out);
}

// *out ← {S0, S0, floor}: loss_scale_decision(rule, ...) from the fp32 loss gradient's statistics at scale 1
// (Scaler::device_loss_rule); its s is S0 too (the loss gradient's S_in is 1).
__device__ inline void decide_loss(const LossScaleRule& rule, const DeviceStats* stats, DeviceScale* out) {
  const LossScaleDecision d = loss_scale_decision(rule, reinterpret_cast<const std::uint64_t*>(stats->binades),
                                                  stats->elements - stats->zero - stats->nonfinite, stats->max_abs);
  *out = DeviceScale{d.s0, d.s0, d.floor, 0};  // s = S0 on S_in = 1: apply_local_scale applies it
}

}  // namespace gradscale::cuda::device
