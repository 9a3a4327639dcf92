// element_wise (SPEC §6.2): the exact version of abs_range. Over every partial product g·w of the
// upstream GEMM with both factors non-zero, lo = max(u_min/|p|, 1) and hi = u_max/|p|/K; s is the largest
// lo, capped by the smallest hi. Only the smallest and the largest |p| matter, which lib/instrument
// streams from the factors (product_range.h) instead of materialising N·K·M products as the reference did.
#include <algorithm>

#include "adaptive/method.h"
#include "lib/core/error.h"

namespace gradscale::adaptive {
namespace {

class ElementWise final : public Method {
 public:
  std::string name() const override { return "element_wise"; }
  StatNeeds needs() const override { return kNeedProductRange; }

  double unbound_scale(const LocalScaleQuery& q, const MethodParams& p) const override {
    GS_CHECK(q.products, "element_wise: the query lacks the product range it asked for");
    const ProductRange& r = *q.products;
    if (r.empty()) return 1.0;
    const auto k = static_cast<double>(q.reduction);
    return std::min(std::max(p.u_min / r.min_abs, 1.0), p.u_max / r.max_abs / k);
  }
};

}  // namespace

std::unique_ptr<Method> make_element_wise() {
  return std::make_unique<ElementWise>();
}

}  // namespace gradscale::adaptive
