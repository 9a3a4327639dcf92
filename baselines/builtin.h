// The built-in loss-scaling policies of baselines/, listed once for the registry
// (policies/catalogue.cpp). gradscale_lib is a static library, so self-registering static objects in
// the policy files would be dropped by the linker; the registry asks for this list on first use instead.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// {policy name, factory} for none, static, torch, deepspeed, megatron, apex, keras, jmp, cerebras and
// popart_als, and the per-layer te_delayed.
std::vector<BuiltinScaler> builtin_scalers();

}  // namespace gradscale::baselines
