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

#include <chrono>
#include <functional>
#include <initializer_list>
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

// Shared steps of the precision model, used by every layer (one implementation).


// The one rounding of a gradient (SPEC §4–§5): d[0..n) ← quantize(multiplier · d, gradient format), with
// the multiplier (a local scale or S0) applied in fp32 before the one rounding. When the monitor
// records, the §3 statistics of the fp32 values (after the multiplier) go to the site's slot of `node`'s
// record (weight gradients merge over weight and bias). A non-finite result, or — for a saturating
// format — a value at or beyond the overflow threshold before rounding, sets found_inf under `node`.
// Returns max|d| before rounding (the fp32 values after the multiplier; inf when something is not finite).
float round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node, const Precision& p,
                     StepMonitor& monitor);
// The two records round_gradient makes, for a backend that measures on a device and fills the monitor
// afterwards: the statistics of a rounding into the site's slot of `node`'s record (weight gradients
// merge over weight and bias), and the found_inf check from max|d| before rounding (`quantized`: the
// values are rounded to the gradient format, i.e. not a weight gradient kept in fp32).
void store_gradient_statistics(StepMonitor& monitor, GradSite site, int node, const TensorStats& stats);
void check_rounded_max(StepMonitor& monitor, GradSite site, int node, float max_abs_before, bool quantized,
                       const Precision& p);
// Rounds `t` (an fp32 activation gradient a non-parametric layer sends upstream, at an unchanged scale)
// in place to the gradient format: round_gradient at the upstream site with multiplier 1.
void round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor);
// The gradient a layer without a GEMM sends upstream (SPEC §5): `gx.g` holds it in fp32 at the scale S
// of `grad_output`. When the scaler's controller acts at this layer (LayerController::acts_at), it is
// asked for a local scale s as a parametric layer is (scale_upstream_grad with no weight, K = 0), s·gx.g
// is rounded once and gx.scale = s·S. Otherwise gx.scale = S, and gx.g is rounded to the gradient
// format when `rounds` (values the layer computed: averages, BatchNorm, dropout's 1/(1−p)) or passed on
// as it is (ReLU, Flatten, Add and non-overlapping max pooling move values already in the format).
void send_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, ScaledGrad& gx, BackwardContext& ctx,
                        bool rounds);
// Rounds a forward output in place to F.
void round_output(Tensor& t, const Precision& p);
// working = quantize(master, F): the per-step working copy of a parameter (SPEC §4).
void round_working_copy(const Parameter& master, Tensor& working, const Precision& p);
// SPEC §5 steps 1–2 of a parametric layer: `gx.g` holds the fp32 upstream product g ⊗ Wᵀ at the scale S
// of `grad_output`. Asks the scaler's controller (if any) which statistics it needs, computes them
// (lib/instrument), gets s, and rounds s·gx.g once (round_gradient); sets gx.scale = s·S.
void scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, const UpstreamProduct& product,
                         ScaledGrad& gx, BackwardContext& ctx);
// The pieces of scale_upstream_grad a device backend shares: the query of step 1 (its raw views set
// only when the data is in host memory; no statistics yet), and the controller's decision on it,
// checked (finite, > 0), its time since `start` added to the monitor's scaler_seconds.
LocalScaleQuery upstream_query(const Layer& layer, const ScaledGrad& grad_output, const UpstreamProduct& product,
                               const Tensor& upstream, const BackwardContext& ctx);
LocalScale checked_decision(LayerController& controller, const LocalScaleQuery& q, const Layer& layer,
                            BackwardContext& ctx, std::chrono::steady_clock::time_point start);
// Weight-gradient step (SPEC §4, §6.5): `g` is the fp32 gradient at scale S; it is multiplied by
// `factor` (r, a power of two), rounded to the gradient format (unless the precision keeps weight
// gradients in fp32), checked for non-finite values, counted about the monitor's edge, and g/(r·S) is
// added to `param.grad`.
// With a `reducer` (data-parallel), g is first summed over the ranks, so the whole batch's gradient is
// what is rounded, checked and applied.
void accumulate_weight_grad(Tensor& g, double scale, Parameter& param, int layer_id, const Precision& p,
                            StepMonitor& monitor, double factor = 1.0, StatisticsReducer* reducer = nullptr);
// The weight-gradient step of one layer: `grads` are its parameters' fp32 gradients at the scale S it
// received (summed over the ranks first, with the context's reducer). Under a per-layer policy (and weight gradients rounded), its controller chooses a factor r
// for each of them from its largest magnitude (LayerController::weight_grad_scale; 1 otherwise), and
// each goes through accumulate_weight_grad at its r; the layer's record keeps the smallest r.
struct WeightGrad {
  Tensor* grad;
  Parameter* param;
};
void accumulate_weight_grads(const Layer& layer, std::initializer_list<WeightGrad> grads, double scale,
                             BackwardContext& ctx);
// r for a layer whose weight gradients' largest fp32 magnitude at scale S is `max_abs` (the controller's
// weight_grad_scale, checked: a finite power of two > 0); 1 under a global policy, a controller that
// does not scale weight gradients, or fp32 weight gradients.
double choose_weight_grad_scale(const Layer& layer, float max_abs, double scale_in, BackwardContext& ctx);
// The statistics a controller asked for (StatNeeds), computed once with lib/instrument on the query's raw
// views; attach() computes them and points the query at them (this object must outlive the query's use).
struct QueryStatistics {
  TensorStats grad_moments, weight_moments, upstream_stats;
  ProductRange products;
  LogMoments grad_log_moments;
  void attach(StatNeeds needs, LocalScaleQuery& q, RoundOptions round,
              const std::function<ProductRange()>& product_range = nullptr);
  // Data-parallel training: reduces what attach() computed over the ranks (the weight's moments are
  // the same on every rank), and withdraws the raw views of this rank's rows (grad, upstream), which
  // are not the whole batch's: a controller decides from the reduced statistics only.
  void reduce(StatisticsReducer& reducer, LocalScaleQuery& q);
};
// Marks the start of a layer's backward in the monitor: it ran, and received a gradient at scale S_in.
void note_backward(int layer_id, double scale_in, StepMonitor& monitor);
// ShapeError "layer 'name': output gradient [..] does not match output [..]" unless the output gradient
// has the shape of the layer's output (the check of a backward that reads both; CPU layers and twins).
void check_output_grad(const Layer& layer, const Tensor& grad_output, const Tensor& output);

}  // namespace gradscale
