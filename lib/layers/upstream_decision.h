// SPEC §5 step 1 from its parts: the controller's query at a layer and its checked decision. Shared by
// gradscale's own layers (upstream_query / checked_decision in layer.h, for the CPU and CUDA backends)
// and by ExternalBackward (a layer another engine computes), so both ask the controller the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "lib/instrument/step_monitor.h"
#include "lib/scaler/controller.h"

namespace gradscale {

// The query at layer `layer_id` (`layer_name` borrowed: it must outlive the query) for a gradient at
// scale `scale_in`: identity, step, gradient format, K and the three shapes with their element counts.
// No raw views and no statistics yet: the caller points the query at host data where it has some.
LocalScaleQuery upstream_query(int layer_id, std::string_view layer_name, std::int64_t step, Format format,
                               double scale_in, std::int64_t reduction, const Shape& grad_shape,
                               const Shape& weight_shape, const Shape& upstream_shape);
// controller.decide(q), checked: NumericError naming `policy` and the layer unless s is finite and > 0.
// Adds the time since `start` to the monitor's scaler_seconds.
LocalScale checked_decision(LayerController& controller, const LocalScaleQuery& q, std::string_view policy,
                            StepMonitor& monitor, std::chrono::steady_clock::time_point start);

}  // namespace gradscale
