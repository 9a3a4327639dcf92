// approx_range (SPEC §6.2), the reference's default method: models the upstream product o = g ⊗ Wᵀ as
// a zero-mean normal whose spread follows from the moments of g and W, and picks the smallest s that
// keeps all but a fraction n_uf of s·o above the smallest subnormal, capped so that the largest possible
// product cannot overflow. Also the two forms used at cast points, where there is no weight.
#include <algorithm>
#include <cmath>

#include "adaptive/math.h"
#include "adaptive/method.h"
#include "lib/core/error.h"

namespace gradscale::adaptive {
namespace {

class ApproxRange final : public Method {
 public:
  std::string name() const override { return "approx_range"; }
  StatNeeds needs() const override { return kNeedGradMoments | kNeedWeightMoments; }

  double unbound_scale(const LocalScaleQuery& q, const MethodParams& p) const override {
    GS_CHECK(q.grad_moments && q.weight_moments, "approx_range: the query lacks the moments it asked for");
    return approx_range_unbound(rule_moments(*q.grad_moments), rule_moments(*q.weight_moments),
                                static_cast<double>(q.reduction), p);
  }
};

}  // namespace

std::unique_ptr<Method> make_approx_range() {
  return std::make_unique<ApproxRange>();
}

double approx_range_no_weight(const TensorStats& g, const MethodParams& p) {
  const double sigma = std::sqrt(g.variance());
  if (!(sigma > 0)) return 1.0;
  double s = std::max(p.u_min / (p.c * sigma), 1.0);
  if (g.max_abs > 0) s = std::min(s, p.u_max / g.max_abs);
  return s;
}

double approx_range_lognormal(const LogMoments& g, double max_abs, const MethodParams& p) {
  if (g.count == 0) return 1.0;
  const double z = normal_quantile_above(p.n_uf);
  double s = std::max(p.u_min * std::exp(z * g.stddev - g.mean), 1.0);
  if (max_abs > 0) s = std::min(s, p.u_max / max_abs);
  return s;
}

}  // namespace gradscale::adaptive
