// The list of adaptive policies (see builtin.h).
#include "adaptive/builtin.h"

#include "adaptive/adaptive_scaler.h"

namespace gradscale::adaptive {

std::vector<BuiltinScaler> builtin_scalers() {
  return {{"adaptive", make_adaptive_scaler, ScalerKind::per_layer}};
}

}  // namespace gradscale::adaptive
