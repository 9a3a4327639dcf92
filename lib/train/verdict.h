// The end of one iteration, shared by every driver of the precision model (ScaledTraining for
// gradscale's own layers, ExternalBackward for another engine's): the controller's end_step and the
// scaler's update give the verdict, and the per-layer rows users read are built from the monitor.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/instrument/step_monitor.h"
#include "lib/scaler/scaler.h"
#include "lib/train/scaled_training.h"

namespace gradscale {

// controller.end_step(monitor), then scaler.update: fills result.report, found_inf,
// first_nonfinite_layer, skipped and phi (the policy's state "phi", 1 for policies without one), and
// adds the time spent to result.scaler_seconds (the monitor's statistics time included).
void scaler_verdict(Scaler& scaler, const StepMonitor& monitor, std::int64_t step, StepResult& result);
// One row per layer of `layers` from the monitor's records (LayerScale).
std::vector<LayerScale> layer_scale_rows(const std::vector<LayerInfo>& layers, const StepMonitor& monitor);

}  // namespace gradscale
