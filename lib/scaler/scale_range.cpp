// The float32 range of a loss scale (see scale_range.h).
#include "lib/scaler/scale_range.h"

#include "lib/core/error.h"

namespace gradscale {

void check_scale_range(const std::string& policy, const char* key, double scale) {
  GS_CHECK_CONFIG(scale_in_float_range(scale),
                  "scaler '" << policy << "': '" << key << "' is " << scale
                             << ", outside the range of a loss scale [" << kMinLossScale << ", " << kMaxLossScale
                             << "] (a normal float32 number, so that the scale can be represented and "
                                "divided out in float32)");
}

}  // namespace gradscale
