// The scaler interface (see scaler.h): the default local scale of a global (loss-level) policy.
#include "lib/scaler/scaler.h"

namespace gradscale {

// Global policies scale only at the loss (SPEC §5): every parametric layer passes its gradient on with s = 1.
double Scaler::local_scale(const LocalScaleQuery& /*query*/) {
  return 1.0;
}

}  // namespace gradscale
