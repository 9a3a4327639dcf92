// A trainable parameter: fp32 master value and fp32 master gradient (SPEC §4). Layers own them; the
// optimizer updates `value` from `grad`; the precision model derives the working copy in F from value.
#pragma once

#include <string>

#include "lib/tensor/tensor.h"

namespace gradscale {

struct Parameter {
  std::string name;          // "fc1.weight", unique within a model
  Tensor value;              // fp32 master weights
  Tensor grad;               // fp32 master gradient (unscaled: already divided by S)
  bool weight_decay = true;  // false for biases and BatchNorm affine parameters
};

}  // namespace gradscale
