// A local-scale decision written as a formula of the statistics (SPEC §6.1–§6.3): the optional form of
// the controller contract (LayerController::device_rule) that lets a device backend decide where the
// statistics are, without the host waiting for them. The formulas below are the adaptive methods'
// one implementation: the host controllers call them (adaptive/), and lib/cuda's one-thread kernel
// calls evaluate_rule — so a decision made on either side is the same double, bit for bit.
// Host-and-device code: no std:: library calls beyond what CUDA provides, no allocation.
#pragma once

#include <cmath>
#include <cstdint>

#include "lib/core/host_device.h"
#include "lib/instrument/histogram.h"

namespace gradscale {

// What the formulas read of a tensor's moments: TensorStats' fields (lib/instrument/histogram.h).
struct RuleMoments {
  double count = 0, sum = 0, sum_squares = 0;
  double min = 0, max = 0, max_abs = 0, min_nonzero_abs = 0;
};
RuleMoments rule_moments(const TensorStats& s);

// The methods' parameters (adaptive::MethodParams): SPEC §6.1's, resolved for the gradient format.
struct ScaleRuleParams {
  double n_uf = 1e-3;           // target fraction of underflowing values
  double c = 0;                 // √2·erf⁻¹(n_uf)
  double u_min = 0, u_max = 0;  // representable range (min subnormal, max finite)
  double relu_factor = 0.5;     // approx_range: fraction of the K products assumed non-zero
  double fixed_scale = 1;       // fixed
  int margin = 4;               // measured: bits of headroom below u_max
};

// SPEC §6.1's bounds, applied after every method.
struct ScaleBounds {
  double scale_upper_bound = 16, accum_upper_bound = 1024;
  bool power_of_two = true;
};

// One layer's decision in one iteration.
struct ScaleRule {
  enum Formula : int {
    kKept = 0,     // reuse `kept` as the unbound s (update_every: not due this step)
    kFixed,        // fixed_scale
    kApproxRange,  // reads the moments of g and W
    kAbsRange,     // reads the moments of g and W
    kMeasured,     // reads the statistics of the fp32 upstream product
  };
  int formula = kKept;
  double kept = 1;
  double reduction = 1;  // K of the upstream GEMM: filled in by the backend from the layer
  ScaleRuleParams params;
  ScaleBounds bounds;
  double factor = 1;  // multiplies the bounded s last: the layer's safety factor φ_l (SPEC §6.5), a power of two
};

// Which statistics a formula reads (the StatNeeds bits of lib/scaler/controller.h).
GS_HOST_DEVICE inline bool rule_reads_moments(int formula) {
  return formula == ScaleRule::kApproxRange || formula == ScaleRule::kAbsRange;
}
GS_HOST_DEVICE inline bool rule_reads_upstream(int formula) { return formula == ScaleRule::kMeasured; }

// ---- the formulas ----------------------------------------------------------------------------------
// std::min / std::max's semantics (the first argument when neither is smaller), on both sides.
GS_HOST_DEVICE inline double rule_min(double a, double b) { return b < a ? b : a; }
GS_HOST_DEVICE inline double rule_max(double a, double b) { return a < b ? b : a; }

// TensorStats::mean and ::variance (population, zeros included).
GS_HOST_DEVICE inline double rule_mean(const RuleMoments& m) { return m.count > 0 ? m.sum / m.count : 0.0; }
GS_HOST_DEVICE inline double rule_variance(const RuleMoments& m) {
  if (m.count == 0) return 0.0;
  const double mu = rule_mean(m);
  return rule_max(0.0, m.sum_squares / m.count - mu * mu);
}

// 2^floor(log2 s) for a finite s > 0; exact.
GS_HOST_DEVICE inline double rule_power_of_two_floor(double s) {
  int e = 0;
  (void)frexp(s, &e);  // s = m·2^e with m in [0.5, 1)
  return ldexp(1.0, e - 1);
}

// ceil(log2 x) for a finite x > 0, exactly (from the binary exponent, not a rounded logarithm).
GS_HOST_DEVICE inline int rule_ceil_log2(double x) {
  int e = 0;
  const double m = frexp(x, &e);  // x = m·2^e with m in [0.5, 1)
  return m == 0.5 ? e - 1 : e;
}

// approx_range with weight (SPEC §6.2): a zero-mean normal model of o = g ⊗ Wᵀ.
GS_HOST_DEVICE inline double approx_range_unbound(const RuleMoments& g, const RuleMoments& w, double k,
                                                  const ScaleRuleParams& p) {
  const double mg = rule_mean(g), vg = rule_variance(g), mw = rule_mean(w), vw = rule_variance(w);
  const double sigma_o = sqrt((vg + mg * mg) * (vw + mw * mw)) * sqrt(p.relu_factor * k);
  if (!(sigma_o > 0)) return 1.0;  // an all-zero gradient or weight: nothing to protect
  double s = rule_max(p.u_min / (p.c * sigma_o), 1.0);
  // The largest |g·w| any product can have, from the signed extremes of both factors.
  const double o_max = rule_max(rule_max(rule_max(fabs(g.max * w.max), fabs(g.min * w.min)), fabs(g.max * w.min)),
                                fabs(g.min * w.max));
  if (o_max > 0) s = rule_min(s, (p.u_max / k) / o_max);  // may go below 1
  return s;
}

// abs_range (SPEC §6.2): bounds every product from the smallest and largest non-zero |g| and |W|.
GS_HOST_DEVICE inline double abs_range_unbound(const RuleMoments& g, const RuleMoments& w, double k,
                                               const ScaleRuleParams& p) {
  if (g.min_nonzero_abs == 0 || w.min_nonzero_abs == 0) return 1.0;  // no non-zero factor on one side
  const double a = g.min_nonzero_abs, b = g.max_abs, c = w.min_nonzero_abs, d = w.max_abs;
  const double o_min = rule_max(rule_min(rule_min(rule_min(a * c, a * d), b * c), b * d), 1e-15);
  const double o_max = b * d;
  return rule_min(rule_max((p.u_min / k) / o_min, 1.0), (p.u_max / k) / o_max);
}

// measured (SPEC §6.3): from the binade histogram of the fp32 upstream product (bins[b] counts
// floor(log2|o|) == kBinadeMin + b), the smallest 2^e ≥ 1 with at most n_uf of the non-zero values
// underflowing — the binade straddling the threshold counts as underflowing — capped so that
// max|s·o| ≤ u_max·2^-margin.
GS_HOST_DEVICE inline double measured_unbound(const std::uint64_t* bins, std::uint64_t nonzero, double max_abs,
                                              const ScaleRuleParams& p) {
  if (nonzero == 0) return 1.0;
  // After scaling by 2^e, binade b covers [2^(b+e), 2^(b+e+1)); it is safe when 2^(b+e) is at least the
  // smallest value that does not round to zero (u_min/2 rounds to 0 by ties-to-even, anything above it
  // does not), i.e. b + e ≥ log2(u_min); below that, the whole binade is counted as underflowing.
  const int safe_from = rule_ceil_log2(p.u_min);
  const double allowed = static_cast<double>(nonzero) * p.n_uf;
  // underflow(e) = Σ_{b < safe_from − e} bins[b] decreases as e grows: walk e up from 0, each step taking
  // the one binade that becomes safe out of the sum (exact integer counts: the sum over the remaining
  // binades; one pass over the bins, which the device's one deciding thread runs too).
  std::uint64_t under = 0;
  for (int b = kBinadeMin; b < safe_from && b <= kBinadeMax; ++b) under += bins[b - kBinadeMin];
  int e = 0;
  while (!(static_cast<double>(under) <= allowed) && safe_from - e > kBinadeMin) {
    ++e;
    const int leaving = safe_from - e;  // the binade now at or above the threshold
    if (leaving <= kBinadeMax) under -= bins[leaving - kBinadeMin];
  }
  double s = ldexp(1.0, e);
  if (max_abs > 0) s = rule_min(s, ldexp(p.u_max, -p.margin) / max_abs);
  return s;
}

// What held a layer's s where it is (the trace's "limit", `gradscale inspect`): the method's own target
// (n_uf), the method's headroom cap (measured: max|s·o| = u_max·2^-margin), scale_upper_bound, the bound
// on the accumulated scale (accum_upper_bound, or the derived B_l), or the safety factor φ_l < 1.
enum ScaleLimit : int { kLimitMethod = 0, kLimitMargin, kLimitScaleBound, kLimitAccumBound, kLimitFactor };
inline const char* scale_limit_name(int limit) {
  switch (limit) {
    case kLimitMargin: return "margin";
    case kLimitScaleBound: return "scale_bound";
    case kLimitAccumBound: return "accum_bound";
    case kLimitFactor: return "phi";
    default: return "method";
  }
}
// Which of them held s = power_of_two(min(unbound, scale bound, accum bound / S_in))·factor: the factor
// when below 1, else the smallest of the three (a bound where it is below the unbound s), else the
// method — its margin cap when `margin_capped`.
GS_HOST_DEVICE inline int scale_limit(double unbound, double scale_in, const ScaleBounds& b, double factor,
                                      bool margin_capped) {
  if (factor < 1) return kLimitFactor;
  const double accum = b.accum_upper_bound / scale_in;
  if (accum < unbound && accum <= b.scale_upper_bound) return kLimitAccumBound;
  if (b.scale_upper_bound < unbound) return kLimitScaleBound;
  return margin_capped ? kLimitMargin : kLimitMethod;
}
// Whether measured's unbound s is its headroom cap (measured_unbound returns exactly this quotient then).
GS_HOST_DEVICE inline bool measured_margin_capped(double unbound, double max_abs, const ScaleRuleParams& p) {
  return max_abs > 0 && unbound == ldexp(p.u_max, -p.margin) / max_abs;
}

// SPEC §6.1's bounds, then a power of two so that scaling is exact: the s a layer applies.
GS_HOST_DEVICE inline double bounded_scale(double unbound, double scale_in, const ScaleBounds& b) {
  double s = rule_min(unbound, b.scale_upper_bound);
  s = rule_min(s, b.accum_upper_bound / scale_in);
  if (b.power_of_two) s = rule_power_of_two_floor(s);
  return s;
}

// SPEC §6.5's weight-gradient factor r: the largest power of two with max|r·g| ≤ u_max, for weight
// gradients whose largest fp32 magnitude at scale S is `max_abs`; kept so that r·S stays a float32
// normal number (the unscale divides by float(r·S)), and so that r itself is a float32 (at most 2^127:
// the product multiplies by float(r), and 2^128 is infinite there — with bf16 or fp32 storage, whose
// u_max is near float32's largest, and S below 1 after back-offs, the other bounds allow it).
// 1 for an all-zero or non-finite gradient.
GS_HOST_DEVICE inline double weight_grad_range_scale(double max_abs, double u_max, double scale_in) {
  if (!(max_abs > 0) || !(max_abs < INFINITY) || !(scale_in > 0)) return 1.0;
  double r = rule_power_of_two_floor(u_max / max_abs);
  if (r * max_abs > u_max) r *= 0.5;  // the quotient rounded up onto a power of two
  const double top = ldexp(1.0, 126) / scale_in;
  if (top > 0 && top < INFINITY) r = rule_min(r, rule_power_of_two_floor(top));
  return rule_min(r, ldexp(1.0, 127));
}

// What a rule reads, wherever the statistics were computed (null where the formula reads nothing).
struct RuleInputs {
  RuleMoments grad, weight;          // kApproxRange, kAbsRange
  const std::uint64_t* upstream_bins = nullptr;  // kMeasured: kBinadeCount bins of the upstream product
  std::uint64_t upstream_nonzero = 0;
  double upstream_max_abs = 0;
  double scale_in = 1;  // S_in
};

// The decision: s (bounded) and the unbound s, as LocalScale holds them.
struct RuleDecision {
  double s = 1, unbound = 1;
  int limit = kLimitMethod;  // ScaleLimit
};
GS_HOST_DEVICE inline RuleDecision evaluate_rule(const ScaleRule& r, const RuleInputs& in) {
  double unbound = r.kept;
  switch (r.formula) {
    case ScaleRule::kFixed: unbound = r.params.fixed_scale; break;
    case ScaleRule::kApproxRange: unbound = approx_range_unbound(in.grad, in.weight, r.reduction, r.params); break;
    case ScaleRule::kAbsRange: unbound = abs_range_unbound(in.grad, in.weight, r.reduction, r.params); break;
    case ScaleRule::kMeasured:
      unbound = measured_unbound(in.upstream_bins, in.upstream_nonzero, in.upstream_max_abs, r.params);
      break;
    default: break;  // kKept
  }
  const bool capped = r.formula == ScaleRule::kMeasured && measured_margin_capped(unbound, in.upstream_max_abs, r.params);
  return RuleDecision{bounded_scale(unbound, in.scale_in, r.bounds) * r.factor, unbound,
                      scale_limit(unbound, in.scale_in, r.bounds, r.factor, capped)};
}

// ---- S0 -------------------------------------------------------------------------------------------
// SPEC §6.5's loss scale as a rule a device can evaluate where the loss gradient's statistics are
// (Scaler::device_loss_rule): S0 = max(φ·base, floor), where floor is the largest power of two not above
// measured's unbound s of the exact fp32 loss gradient (0 when that s is not finite or not above 0), and
// base is the policy's S0 before φ (init_scale), or the floor itself (init_scale "auto" with cast_form
// "measured"). The adaptive policy's host decision (adaptive/adaptive_scaler.cpp) is this function.
struct LossScaleRule {
  ScaleRuleParams params;  // the measured floor's: n_uf, u_min, u_max, margin
  double phi = 1;          // the loss scale's safety factor φ
  double base = 1;         // S0 before φ, unless base_is_floor
  bool base_is_floor = false;
};
struct LossScaleDecision {
  double s0 = 1, floor = 0;
};
GS_HOST_DEVICE inline LossScaleDecision loss_scale_decision(const LossScaleRule& r, const std::uint64_t* bins,
                                                            std::uint64_t nonzero, double max_abs) {
  const double unbound = measured_unbound(bins, nonzero, max_abs, r.params);
  const double floor = unbound > 0 && unbound < INFINITY ? rule_power_of_two_floor(unbound) : 0.0;
  return LossScaleDecision{rule_max(r.phi * (r.base_is_floor ? floor : r.base), floor), floor};
}

}  // namespace gradscale
