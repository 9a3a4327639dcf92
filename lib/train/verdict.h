// The loss-level policy's two decisions in one iteration, shared by every driver of the precision
// model (ScaledTraining for gradscale's own layers, ExternalBackward for another engine's): S0 from
// the fp32 loss gradient at the start, and at the end the verdict (the controller's end_step and the
// scaler's update); and the per-layer rows users read, built from the monitor.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/instrument/step_monitor.h"
#include "lib/layers/layer.h"
#include "lib/scaler/scaler.h"
#include "lib/train/scaled_training.h"

namespace gradscale {

// S0 = scaler.choose_loss_scale on the fp32 loss gradient g (n values at scale 1, before rounding),
// with the statistics the policy asks for (loss_needs(); none: g is not read and may be null).
// ConfigError-free: a chosen S0 that is not finite and > 0 is a NumericError naming the policy.
// With a `reducer` (data-parallel training, g is this rank's rows) the statistics are reduced over the
// ranks first, so every rank chooses the S0 of the whole batch.
double choose_loss_scale(Scaler& scaler, const float* g, const Shape& shape, std::int64_t step, const Precision& p,
                         StatisticsReducer* reducer = nullptr);
// controller.end_step(monitor), then scaler.update: fills result.report, found_inf,
// first_nonfinite_layer, skipped and phi (Scaler::phi() after the update), and
// adds the time spent to result.scaler_seconds (the monitor's statistics time included).
void scaler_verdict(Scaler& scaler, const StepMonitor& monitor, std::int64_t step, StepResult& result);
// One row per layer of `layers` from the monitor's records (LayerScale).
std::vector<LayerScale> layer_scale_rows(const std::vector<LayerInfo>& layers, const StepMonitor& monitor);

}  // namespace gradscale
