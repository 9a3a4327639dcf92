// The policies of adaptive/, listed once for the policy catalogue (policies/catalogue.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lib/scaler/scaler.h"

namespace gradscale::adaptive {

// {"adaptive", factory}: the per-layer methods are chosen by its "method" key.
std::vector<BuiltinScaler> builtin_scalers();

}  // namespace gradscale::adaptive
