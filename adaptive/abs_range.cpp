// abs_range (SPEC §6.2): the reference's range method. From the smallest and largest non-zero |g| and
// |W| it bounds every product and picks s so that the smallest one (divided over K, as the reference
// does) stays representable and the largest K-fold sum cannot overflow.
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
    return abs_range_unbound(rule_moments(*q.grad_moments), rule_moments(*q.weight_moments),
                             static_cast<double>(q.reduction), p);
  }
};

}  // namespace

std::unique_ptr<Method> make_abs_range() {
  return std::make_unique<AbsRange>();
}

}  // namespace gradscale::adaptive
