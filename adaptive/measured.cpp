// measured (SPEC §6.3, ours): the upstream GEMM accumulates in fp32, so the values about to be rounded
// are known exactly before rounding. From the binade histogram of that fp32 product o (at S_in) it picks
// the smallest power of two s ≥ 1 for which at most a fraction n_uf of the non-zero values would round
// to zero — counting the binade that straddles the threshold as underflowing, so the estimate is
// conservative — capped so that max|s·o| ≤ u_max·2^-margin. No distribution is assumed and no weight
// statistics are needed.
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
    return measured_unbound(o.binades.data(), o.nonzero_finite(), o.max_abs, p);
  }
};

}  // namespace

std::unique_ptr<Method> make_measured() {
  return std::make_unique<Measured>();
}

}  // namespace gradscale::adaptive
