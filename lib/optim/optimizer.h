// The optimizer interface: one update of the fp32 master weights from their fp32 master gradients
// (SPEC §4), with PyTorch's semantics so results compare with torch.optim. A skipped step (found_inf)
// is simply not calling step(): weights, moments and the step count stay exactly as they were.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/optim/parameter.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

// The element loops of an update for parameters that live in a device's memory, as a device backend
// provides them (Backend::optimizer_kernels). The optimizer computes every scalar on the host exactly as
// its CPU loop does, so a kernel that follows the CPU loop's fp32 operations gives the same bits.
struct SgdStep {
  float lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  bool first = false;  // the first applied step: the momentum buffer starts as a copy of d
};
struct AdamStep {
  float neg_step_size = 0, bias_correction2_sqrt = 1;
  float beta1 = 0.9f, one_minus_beta1 = 0.1f, beta2 = 0.999f, one_minus_beta2 = 0.001f, eps = 1e-8f;
  float weight_factor = 1;  // AdamW's 1 − lr·wd
  float weight_decay = 0;   // Adam's coupled wd
  bool decay_weight = false, decay_grad = false;
};
class DeviceOptimizerKernels {
 public:
  virtual ~DeviceOptimizerKernels() = default;
  // momentum_buffer is null when momentum is 0.
  virtual void sgd(float* w, const float* g, float* momentum_buffer, std::size_t n, const SgdStep& s) = 0;
  virtual void adam(float* w, const float* g, float* m, float* v, std::size_t n, const AdamStep& s) = 0;
  // Optimizer::step brackets its parameters' updates with these: the kernels may queue the updates
  // made between them and run them together at end_step(true); end_step(false) (an update threw)
  // drops what was queued, so the step changes nothing.
  virtual void begin_step() {}
  virtual void end_step(bool /*apply*/) {}
};

// One named optimizer state tensor, e.g. {"fc1.weight/momentum_buffer", tensor}.
using StateTensor = std::pair<std::string, Tensor*>;
using ConstStateTensor = std::pair<std::string, const Tensor*>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update to every parameter from its `grad`, with learning rate `lr` (finite, >= 0,
  // else ConfigError), and counts one applied step.
  // Requires: the same parameters (names and shapes, in the same order) on every call; the first call
  // binds them and allocates the state (zero allocation on later calls). grad.shape() == value.shape()
  // (else ShapeError); gradients are finite (a step with found_inf must not be applied).
  // Parameter::weight_decay == false excludes that parameter from weight decay.
  // Ensures: all-or-nothing — when it throws, nothing was changed. Math is fp32 with a fixed order per
  // element, so the result does not depend on the number of OpenMP threads.
  void step(const std::vector<Parameter*>& params, double lr);

  const std::string& name() const { return name_; }  // "sgd", "adam", "adamw"
  // The element loops for parameters in device memory (null: every parameter is on the host). Set by
  // ScaledTraining from its model's backend; the state tensors are allocated where the parameters are.
  void use_device(DeviceOptimizerKernels* kernels) { device_ = kernels; }
  // Number of applied steps so far: the argument for LrSchedule::lr() and Adam's bias correction.
  std::int64_t step_count() const { return steps_; }

  // The resolved configuration, {"name": ..., hyperparameters...} with defaults filled in;
  // make_optimizer(config()) builds an identical optimizer.
  virtual nlohmann::json config() const = 0;

  // --- checkpoint and resume -------------------------------------------------------------------
  // The scalar state, JSON only: {"optimizer": config(), "step": n, "parameters": [{"name", "shape"}...]}
  // ("parameters" is empty before the first step).
  nlohmann::json state() const;
  // The state tensors, parameter-major in the bound order, keyed "<parameter>/<slot>" with slots named as
  // in PyTorch's state_dict ("momentum_buffer"; "exp_avg", "exp_avg_sq"). Store their raw fp32 contents.
  // Empty before the first step. Pointers stay valid until the next restore_state(); the optimizer owns
  // the tensors.
  std::vector<StateTensor> state_tensors();
  std::vector<ConstStateTensor> state_tensors() const;
  // Restores state() onto `params` (the resumed model's parameters). Throws ConfigError when the
  // checkpoint's optimizer configuration differs (names the key), or when its parameters differ in
  // number, name or shape (names the parameter). On success the state tensors are allocated (zeros)
  // with the checkpoint's shapes; the caller then fills every tensor of state_tensors() with the stored
  // raw contents. Subsequent steps are then bit-identical to the uninterrupted run.
  void restore_state(const nlohmann::json& state, const std::vector<Parameter*>& params);

 protected:
  // `slot_names`: the per-parameter state tensors this optimizer keeps (may be empty).
  Optimizer(std::string name, std::vector<std::string> slot_names);

  // One parameter's update. `slots` holds the parameter's state tensors in slot_names order, shaped like
  // the parameter; `step` is the 1-based number of this step (1 = first applied step).
  virtual void update(Parameter& param, std::vector<Tensor>& slots, std::int64_t step, double lr) = 0;

  // The device's element loops for a parameter whose value lives in device memory (ConfigError when
  // the optimizer was not given any).
  DeviceOptimizerKernels& device_kernels(const Parameter& param) const;

  // Element loops run in parallel (OpenMP, static schedule) from this many elements on.
  static constexpr std::int64_t kParallelMinElements = std::int64_t{1} << 16;

 private:
  struct Bound {
    std::string name;
    Shape shape;
    std::vector<Tensor> slots;
  };
  void bind(const std::vector<Parameter*>& params, bool check_grads);
  void check_bound(const std::vector<Parameter*>& params) const;

  std::string name_;
  std::vector<std::string> slot_names_;
  std::vector<Bound> bound_;  // valid iff steps_ > 0
  std::int64_t steps_ = 0;
  DeviceOptimizerKernels* device_ = nullptr;
};

// Builds an optimizer from its JSON configuration (keys, defaults and ranges in docs/optim.md):
//   {"name":"sgd",  "momentum":0, "nesterov":false, "weight_decay":0}
//   {"name":"adam", "beta1":0.9, "beta2":0.999, "eps":1e-8, "weight_decay":0}
//   {"name":"adamw", ... as adam, "weight_decay":0.01}
// A plain string ("adam") means {"name": that}. Unknown names or keys and out-of-range values throw
// ConfigError naming the key and the allowed range.
std::unique_ptr<Optimizer> make_optimizer(const nlohmann::json& cfg);

}  // namespace gradscale
