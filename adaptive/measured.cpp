// measured (SPEC §6.3, ours): the upstream GEMM accumulates in fp32, so the values about to be rounded
// are known exactly before rounding. From the binade histogram of that fp32 product o (at S_in) it picks
// the smallest power of two s ≥ 1 for which at most a fraction n_uf of the non-zero values would round
// to zero — counting the binade that straddles the threshold as underflowing, so the estimate is
// conservative — capped so that max|s·o| ≤ u_max·2^-margin. No distribution is assumed and no weight
// statistics are needed.
#include <algorithm>
#include <cmath>

#include "adaptive/method.h"
#include "lib/core/error.h"

namespace gradscale::adaptive {
namespace {

class Measured final : public Method {
 public:
  std::string name() const override { return "measured"; }
  StatNeeds needs() const override { return kNeedUpstreamStats; }

  double unbound_scale(const LocalScaleQuery& q, const MethodParams& p) const override {
    GS_CHECK(q.upstream_stats, "measured: the query lacks the upstream statistics it asked for");
    const TensorStats& o = *q.upstream_stats;
    const std::uint64_t nonzero = o.nonzero_finite();
    if (nonzero == 0) return 1.0;
    // After scaling by 2^e, binade b covers [2^(b+e), 2^(b+e+1)); it is safe when 2^(b+e) is at least the
    // smallest value that does not round to zero (u_min/2 rounds to 0 by ties-to-even, anything above
    // does not), i.e. b + e ≥ log2(u_min); below that, the whole binade is counted as underflowing.
    const int safe_from = static_cast<int>(std::ceil(std::log2(p.u_min)));  // exponent of u_min
    const auto allowed = static_cast<double>(nonzero) * p.n_uf;
    // underflow(e) = Σ_{b < safe_from − e} bins[b] decreases as e grows: walk e up from 0.
    int e = 0;
    for (;; ++e) {
      std::uint64_t under = 0;
      for (int b = kBinadeMin; b < safe_from - e && b <= kBinadeMax; ++b) under += o.binade(b);
      if (static_cast<double>(under) <= allowed || safe_from - e <= kBinadeMin) break;
    }
    double s = std::ldexp(1.0, e);
    if (o.max_abs > 0) s = std::min(s, std::ldexp(p.u_max, -p.margin) / o.max_abs);
    return s;
  }
};

}  // namespace

std::unique_ptr<Method> make_measured() {
  return std::make_unique<Measured>();
}

}  // namespace gradscale::adaptive
