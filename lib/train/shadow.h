// What precision costs each layer: an fp32 shadow of the backward pass (ScaledTraining::set_shadow,
// `gradscale train --shadow`, docs/trace.md). On a step with statistics the model's backward runs
// twice over the same forward values: first in fp32 with nothing rounded and nothing scaled (the loss
// gradient at scale 1, local scales 1, weight gradients kept in fp32), recording every gradient a
// layer sends upstream and each layer's weight gradients; then as the step's own pass, whose gradients,
// divided by their scales, are compared with the shadow's layer by layer (ShadowMetrics in the step's
// monitor, written to the trace).
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "lib/instrument/step_monitor.h"
#include "lib/layers/layer.h"

namespace gradscale {

class Model;

// Sums over a layer's parts for ShadowMetrics, in double.
struct ShadowSums {
  double lost = 0, total = 0;               // Σ|before| where the stored value is 0, Σ|before|
  double diff2 = 0, ref2 = 0, lp2 = 0, dot = 0;
  void add_mass(const float* before, const float* after, std::size_t n);
  void add_error(const float* lp, double lp_scale, const float* ref, std::size_t n);
  ShadowMetrics metrics() const;
};

// The shadow pass's observer: keeps each layer's upstream gradient (fp32, scale 1).
class ShadowRecorder final : public GradientObserver {
 public:
  void upstream(int layer_id, const float* before, const float* after, std::size_t n, double scale) override;
  void weight(int, const float*, const float*, std::size_t, double) override {}
  // After the shadow pass: every parameter's gradient (true, fp32), by layer.
  void take_weight_grads(Model& model);

  std::map<int, std::vector<float>> upstream_;
  std::map<int, std::vector<std::vector<float>>> weight_grads_;  // per layer, its parameters in order
};

// The step's own pass: compares with the recording and writes the metrics into `monitor`'s records.
class ShadowComparison final : public GradientObserver {
 public:
  ShadowComparison(ShadowRecorder& shadow, StepMonitor& monitor) : shadow_(shadow), monitor_(monitor) {}
  void upstream(int layer_id, const float* before, const float* after, std::size_t n, double scale) override;
  void weight(int layer_id, const float* before, const float* after, std::size_t n, double scale) override;
  // After the pass: the weight gradients' errors from the parameters' gradients (true, after unscale).
  void finish(Model& model);

 private:
  ShadowRecorder& shadow_;
  StepMonitor& monitor_;
  std::map<int, ShadowSums> weight_mass_;
};

}  // namespace gradscale
