// The layer interface of the CPU engine (SPEC §4–§5). A layer maps input tensors (values in F) to an
// output tensor (values in F) and, backward, a scaled gradient (g in F, scale S) of its output to
// scaled gradients of its inputs. Parametric layers ask the scaler for a local scale s and write
// unscaled fp32 master gradients. Layers own their parameters; the model owns activations. The steps of
// the precision model every layer shares (rounding, the local-scale step, weight gradients) are
// declared in lib/layers/precision_ops.h.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>

#include "lib/core/random.h"
#include "lib/instrument/histogram.h"
#include "lib/instrument/product_range.h"
#include "lib/instrument/statistics_reducer.h"
#include "lib/instrument/step_monitor.h"
#include "lib/scaler/controller.h"
#include "lib/numeric/quantize.h"
#include "lib/optim/parameter.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

class Scaler;

// Where values live (SPEC §4): `format` for forward values and working weights, the gradient format
// (`grad_format`, by default the same) for activation and weight gradients.
struct Precision {
  Format format = Format::fp32;
  std::optional<Format> grad_format = std::nullopt;  // unset: gradients in `format`
  RoundOptions round{};
  bool quantize_weight_grads = true;  // false: weight gradients stay fp32 (ablation)
  Format gradient_format() const { return grad_format.value_or(format); }
};

// A gradient travelling backward: the true gradient is g / scale.
struct ScaledGrad {
  Tensor g;
  double scale = 1.0;
  // A device backend that decided this scale on the device (without the host waiting) keeps it there:
  // the index of its entry in the backend's scale table for the current backward pass, and `scale` is
  // not yet known on the host (the backend reports it in the StepMonitor's records by finish_backward).
  // -1: `scale` is the value. Host layers only ever see -1.
  int device_scale = -1;
};

// The local-scale step of one parametric layer (SPEC §5 steps 1–2), as the layer describes it.
struct UpstreamProduct {
  const Tensor& weight;          // working weight W (values in F)
  std::int64_t reduction = 1;    // K
  std::function<ProductRange()> product_range;  // the exact partial-product range (element_wise), on demand
};

struct ForwardContext {
  const Precision& precision;
  bool training = true;
  std::mt19937_64* rng = nullptr;  // dropout masks; required when training with dropout
};

// Sees each gradient a layer rounds and sends on, in host memory: the fp32 values just before the
// rounding and the stored values after, with the scale they are stored at (lib/train/shadow.h compares
// them with an fp32 shadow of the pass). A backward pass without one pays nothing.
class GradientObserver {
 public:
  virtual ~GradientObserver() = default;
  // The gradient layer `layer_id` sends upstream (after its local scale s), stored at `scale`.
  virtual void upstream(int layer_id, const float* before, const float* after, std::size_t n, double scale) = 0;
  // One of its weight-gradient parts, stored at `scale` (its factor r times S_in).
  virtual void weight(int layer_id, const float* before, const float* after, std::size_t n, double scale) = 0;
};

struct BackwardContext {
  const Precision& precision;
  Scaler& scaler;  // the loss-level policy; its layer_controller() chooses local scales
  StepMonitor& monitor;
  std::int64_t step = 0;  // iteration index, for the controller's queries
  // Data-parallel training (lib/dist): reduces each statistic a decision depends on over the ranks
  // (lib/instrument/statistics_reducer.h). Null in one process.
  StatisticsReducer* reducer = nullptr;
  GradientObserver* observer = nullptr;  // host layers only (ScaledTraining's fp32 shadow)
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  int id() const { return id_; }
  void set_id(int id) { id_ = id; }

  virtual std::string kind() const = 0;
  virtual int num_inputs() const { return 1; }
  // Output shape for these input shapes; throws ShapeError naming the layer when they do not fit.
  virtual Shape output_shape(const std::vector<Shape>& inputs) const = 0;

  // output = layer(inputs), values in F. `output` is owned by the caller and resized here.
  virtual void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) = 0;
  // From the scaled gradient of the output, the scaled gradients of the inputs (a null entry in
  // `grad_inputs` means that input needs none). `inputs` and `output` are those of the last forward.
  // Parametric layers add their unscaled gradients to Parameter::grad.
  virtual void backward(const std::vector<const Tensor*>& inputs, const Tensor& output,
                        const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                        BackwardContext& ctx) = 0;

  virtual std::vector<Parameter*> parameters() { return {}; }
  // Working weights = quantize(master, F), once per step before forward.
  virtual void prepare_weights(const Precision&) {}
  // Non-trainable state (BatchNorm running statistics) for checkpoints: named tensors.
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }
  // Sizes left to the graph (a layer built from Options without its input size): called by
  // Model::finalize, in layer order, with the input shapes, before output_shape. Such a layer allocates
  // its parameters here and initialises them from `init_rng` (ConfigError naming the layer when it is
  // null but needed). Default: nothing to infer.
  virtual void infer_sizes(const std::vector<Shape>& /*inputs*/, Rng* /*init_rng*/) {}
  // For the layer table of traces: kind-specific description (shape, K, ...).
  virtual nlohmann::json describe() const { return {{"name", name_}, {"kind", kind()}}; }
  // K of SPEC §6.1 for parametric layers (reduction length of the upstream GEMM), else 0.
  virtual std::int64_t reduction_length() const { return 0; }
  // Whether the output holds values of the forward format F (whatever the batch) when the inputs do,
  // and whether the input gradients hold values of the gradient format when the output gradient does.
  // A device backend may then store them in F for its GEMMs (Model::use_backend works it out over the
  // graph: the model input is fp32 data, the loss gradient and a join are rounded). The default, for a
  // layer the library does not know, is "no": the safe answer.
  virtual bool output_in_format(bool /*inputs_in_format*/) const { return false; }
  virtual bool input_grads_in_format(bool /*output_grad_in_format*/) const { return false; }

 protected:
  std::string name_;
  int id_ = -1;
};

// What a model's graph guarantees about a layer's operands (Model::use_backend works it out from
// Layer::output_in_format and input_grads_in_format): every input holds values of the forward format
// F whatever the batch (not so for the model input, which is fp32 data), and the output gradient holds
// values of the gradient format.
struct LayerPlacement {
  bool inputs_in_format = false;
  bool output_grad_in_format = false;
};

}  // namespace gradscale
