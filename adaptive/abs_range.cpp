// abs_range (SPEC §6.2): the reference's range method. From the smallest and largest non-zero |g| and
// |W| it bounds every product and picks s so that the smallest one (divided over K, as the reference
// does) stays representable and the largest K-fold sum cannot overflow.
#include <algorithm>

#include "adaptive/method.h"
#include "lib/core/error.h"

namespace gradscale::adaptive {
namespace {

class AbsRange final : public Method {
 public:
  std::string name() const override { return "abs_range"; }
  StatNeeds needs() const override { return kNeedGradMoments | kNeedWeightMoments; }

  double unbound_scale(const LocalScaleQuery& q, const MethodParams& p) const override {
    GS_CHECK(q.grad_moments && q.weight_moments, "abs_range: the query lacks the moments it asked for");
    const TensorStats& g = *q.grad_moments;
    const TensorStats& w = *q.weight_moments;
    if (g.min_nonzero_abs == 0 || w.min_nonzero_abs == 0) return 1.0;  // no non-zero factor on one side
    const double a = g.min_nonzero_abs, b = g.max_abs, c = w.min_nonzero_abs, d = w.max_abs;
    const double o_min = std::max(std::min({a * c, a * d, b * c, b * d}), 1e-15);
    const double o_max = b * d;
    const auto k = static_cast<double>(q.reduction);
    return std::min(std::max((p.u_min / k) / o_min, 1.0), (p.u_max / k) / o_max);
  }
};

}  // namespace

std::unique_ptr<Method> make_abs_range() {
  return std::make_unique<AbsRange>();
}

}  // namespace gradscale::adaptive
