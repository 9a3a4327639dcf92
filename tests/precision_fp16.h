// Test helper: a Precision that stores forward values and gradients in fp16, the rest at its defaults.
#pragma once

#include "lib/layers/layer.h"

namespace gradscale::testing {

inline Precision fp16() {
  Precision p;
  p.format = Format::fp16;
  return p;
}

}  // namespace gradscale::testing
