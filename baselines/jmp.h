// Policy `jmp`: DynamicLossScale of DeepMind's jmp (mixed precision for JAX, jmp/_src/loss_scale.py).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "lib/scaler/scaler.h"

namespace gradscale::baselines {

// Parameters (jmp's names; loss_scale and min_loss_scale are float32 arrays in jmp):
//   loss_scale      2^15  finite, >= min_loss_scale. jmp has no default (the caller passes the initial
//                         array); 2^15 is the value of jmp's own examples.
//   period          2000  integer >= 1
//   factor          2     finite, > 1 (an int in jmp; any real > 1 is accepted, applied in float32)
//   min_loss_scale  1     finite, > 0
// Update:
//   F: if counter == period - 1: scale = scale * factor if that is finite (else unchanged).
//   I: scale = max(min_loss_scale, scale / factor); the step is skipped.
//   counter = ((counter + 1) mod period) if F, else 0.
// State: {"loss_scale": float32, "counter": integer}.
std::unique_ptr<Scaler> make_jmp_scaler(const nlohmann::json& config, Format format);

}  // namespace gradscale::baselines
