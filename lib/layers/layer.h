// The layer interface of the CPU engine (SPEC §4–§5). A layer maps input tensors (values in F) to an
// output tensor (values in F) and, backward, a scaled gradient (g in F, scale S) of its output to
// scaled gradients of its inputs. Parametric layers ask the scaler for a local scale s and write
// unscaled fp32 master gradients. Layers own their parameters; the model owns activations.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"
#include "lib/optim/parameter.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

class Scaler;

// Where values live (SPEC §4): F for activations, activation gradients, working weights.
struct Precision {
  Format format = Format::fp32;
  RoundOptions round{};
  bool quantize_weight_grads = true;  // false: weight gradients stay fp32 (ablation)
};

// A gradient travelling backward: the true gradient is g / scale.
struct ScaledGrad {
  Tensor g;
  double scale = 1.0;
};

// What one backward pass observed, per layer (filled only when statistics are recorded).
struct LayerRecord {
  int layer_id = -1;
  double local_scale = 1.0;     // s chosen by the controller
  double scale_in = 1.0;        // S of the gradient the layer received
  TensorStats activation_grad;  // the fp32 upstream gradient (times s) just before rounding to F
  TensorStats weight_grad;      // the fp32 weight gradient before rounding to F (scaled by S)
  bool has_activation_grad = false, has_weight_grad = false;
};

// Collects found_inf and per-layer statistics during one iteration. Passed explicitly.
struct StepMonitor {
  bool found_inf = false;
  int first_nonfinite_layer = -1;  // in backward order: the first layer that produced a non-finite value
  bool record = false;             // take full tensor_stats (trace steps, statistics-driven scalers)
  double gradient_edge = 0.0;      // > 0: count weight gradients about this edge (popart_als)
  std::uint64_t grad_below_edge = 0, grad_above_edge = 0;
  std::vector<LayerRecord> records;  // indexed by layer id

  // Clears everything for an iteration of a model with `num_layers` layers.
  void reset(int num_layers, bool record_stats, double edge);
  void note_nonfinite(int layer_id);
  LayerRecord& record_of(int layer_id);
};

struct ForwardContext {
  const Precision& precision;
  bool training = true;
  std::mt19937_64* rng = nullptr;  // dropout masks; required when training with dropout
};

struct BackwardContext {
  const Precision& precision;
  Scaler& scaler;
  StepMonitor& monitor;
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
  // For the layer table of traces: kind-specific description (shape, K, ...).
  virtual nlohmann::json describe() const { return {{"name", name_}, {"kind", kind()}}; }
  // K of SPEC §6.1 for parametric layers (reduction length of the upstream GEMM), else 0.
  virtual std::int64_t reduction_length() const { return 0; }

 protected:
  std::string name_;
  int id_ = -1;
};

// Shared steps of the precision model, used by every layer (one implementation).
// Rounds `t` (an fp32 activation gradient, already multiplied by the local scale) in place to F,
// records its statistics before rounding when the monitor records, and reports non-finite values.
void round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor);
// Rounds a forward output in place to F.
void round_output(Tensor& t, const Precision& p);
// working = quantize(master, F): the per-step working copy of a parameter (SPEC §4).
void round_working_copy(const Parameter& master, Tensor& working, const Precision& p);
// SPEC §5 steps 1–2 of a parametric layer: `gx.g` holds the fp32 upstream product g ⊗ Wᵀ at the
// scale S of `grad_output`. Asks the scaler for s (with the layer's working weight and K), multiplies
// gx.g by s, rounds it to F once (round_activation_grad) and sets gx.scale = s·S.
void scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, const Tensor& weight_working,
                         ScaledGrad& gx, BackwardContext& ctx);
// Weight-gradient step (SPEC §4): `g` is the fp32 gradient at scale S; it is rounded to F (unless the
// precision keeps weight gradients in fp32), checked for non-finite values, counted about the
// monitor's edge, and g/S is added to `param.grad`.
// Statistics go to the layer's record (merged over its weight and bias) when the monitor records.
void accumulate_weight_grad(Tensor& g, double scale, Parameter& param, int layer_id, const Precision& p,
                            StepMonitor& monitor);

}  // namespace gradscale
