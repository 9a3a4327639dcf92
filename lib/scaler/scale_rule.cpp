// The host side of lib/scaler/scale_rule.h: a TensorStats as the moments a rule reads.
#include "lib/scaler/scale_rule.h"

namespace gradscale {

RuleMoments rule_moments(const TensorStats& s) {
  return RuleMoments{static_cast<double>(s.count), s.sum, s.sum_squares, s.min, s.max, s.max_abs, s.min_nonzero_abs};
}

}  // namespace gradscale
