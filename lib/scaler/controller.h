// The per-layer controller contract (SPEC §5–§6): what a controller that chooses a local scale s per
// parametric layer is told, and when. The engine binds it to the model's layer table once, tells it when
// each iteration begins (step index and the safety factor φ), asks which statistics it needs at a
// layer before the layer's upstream gradient is rounded, computes exactly those with lib/instrument
// (never the controller), passes them in a LocalScaleQuery, applies the returned s, and hands the
// iteration's per-layer records to end_step. A controller is owned by its loss-level policy (Scaler),
// which serialises its state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/instrument/histogram.h"
#include "lib/instrument/log_moments.h"
#include "lib/instrument/product_range.h"
#include "lib/instrument/step_monitor.h"
#include "lib/numeric/format.h"
#include "lib/scaler/scale_rule.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

// One row of the model's layer table, as a controller sees it.
struct LayerInfo {
  int id = -1;
  std::string name, kind;
  bool parametric = false;   // Linear / Conv2d: asks for a local scale
  std::int64_t reduction = 0;  // K of SPEC §6.1 (0 for other layers)
  Shape weight_shape;          // empty for layers without a weight
  // The ids of the layers whose outputs it reads (-1: the model's input); empty where the engine does not
  // know its graph (an outside engine). The last layer's output is the one the loss reads.
  std::vector<int> inputs = {};
};

// Statistics a controller may ask for at a layer (bit set). Each is computed once per query by the
// engine through lib/instrument.
using StatNeeds = unsigned;
enum : StatNeeds {
  kNeedGradMoments = 1u << 0,    // tensor_moments of the incoming gradient g (stored values, at S_in)
  kNeedWeightMoments = 1u << 1,  // tensor_moments of the working weight W
  kNeedUpstreamStats = 1u << 2,  // tensor_stats (classes, binades) of the fp32 upstream product at S_in
  kNeedProductRange = 1u << 3,   // the exact partial-product range of the upstream GEMM
  kNeedGradLogMoments = 1u << 4,  // moments of ln|g| (lognormal form at cast points)
};

// What a layer (or the loss, a cast point) tells the controller (SPEC §5 step 1). Pointers are borrowed
// for the duration of the call; a statistics pointer is null unless the controller asked for it.
struct LocalScaleQuery {
  int layer_id = -1;  // -1: the loss gradient (the cast point every model has)
  std::string_view layer_name;
  std::int64_t step = 0;       // iteration index, from 0
  Format format = Format::fp32;  // the gradient format the result is rounded to
  double scale_in = 1.0;       // S_in: the accumulated scale of `grad`
  std::int64_t reduction = 1;  // K: reduction length of the upstream GEMM (0 at cast points)
  Shape grad_shape, weight_shape, upstream_shape;  // weight_shape empty at cast points
  // Raw views, for controllers that need more than the statistics below.
  const float* grad = nullptr;  // incoming gradient g: values in F (layers) or fp32 (the loss)
  std::int64_t grad_size = 0;
  const float* weight = nullptr;  // working weight W (values in F); null at cast points
  std::int64_t weight_size = 0;
  const float* upstream = nullptr;  // g ⊗ Wᵀ in fp32 at scale S_in, before rounding (null at cast points)
  std::int64_t upstream_size = 0;
  // The statistics asked for through needs().
  const TensorStats* grad_moments = nullptr;
  const TensorStats* weight_moments = nullptr;
  const TensorStats* upstream_stats = nullptr;
  const ProductRange* products = nullptr;
  const LogMoments* grad_log_moments = nullptr;
};

// The decision at one layer: s is applied; `unbound` is the controller's choice before its bounds and
// rounding to a power of two (for traces; equal to s when there are none).
struct LocalScale {
  double s = 1.0;
  double unbound = 1.0;
  int limit = 0;  // what held s (lib/scaler/scale_rule.h's ScaleLimit; 0: the method's own choice)
};

// A layer's weight-gradient step (SPEC §6.5): the largest magnitude of its weight and bias gradients in
// fp32 at the scale it received, before rounding, from which the controller chooses the factor r they
// are stored at.
struct WeightGradQuery {
  int layer_id = -1;
  std::string_view layer_name;
  std::int64_t step = 0;
  Format format = Format::fp32;  // the gradient format they are rounded to
  double scale_in = 1.0;         // S_in
  double max_abs = 0;            // inf when a value is not finite
};

struct StepBegin {
  std::int64_t step = 0;  // iteration index, from 0
  double phi = 1.0;       // overflow safety factor of SPEC §6.4 (1 when the policy has none)
};

class LayerController {
 public:
  virtual ~LayerController() = default;
  // Once, before the first iteration: the model's layers (ids 0..L-1) and the gradient format.
  virtual void bind(const std::vector<LayerInfo>& layers, Format grad_format) = 0;
  virtual void begin_step(const StepBegin& step) = 0;
  // Statistics the query at `layer_id` must carry in the current iteration (0: none).
  virtual StatNeeds needs(int layer_id) const = 0;
  virtual LocalScale decide(const LocalScaleQuery& query) = 0;
  // Optional: whether the controller also decides the local scale at `layer_id` when that layer is not
  // parametric — one that sends a gradient upstream without a GEMM (BatchNorm, pooling, ReLU, Flatten,
  // Dropout, Add). The engine then asks needs() and decide() there as at a parametric layer; the query
  // has no weight (null, K = 0) and its upstream view is the fp32 gradient the layer computed at S_in.
  // Parametric layers (Linear, Conv2d) are always asked. Default: no (the paper's rule: such a layer
  // passes its gradient on at the scale it received). CPU backend only in this version.
  virtual bool acts_at(int /*layer_id*/) const { return false; }
  // Optional: the decision at `layer_id` in the current iteration as a formula of the statistics
  // (lib/scaler/scale_rule.h), when it is one. A device backend then computes the statistics the rule
  // reads and evaluates it where they are, without the host waiting, and reports the decision through
  // accept() before end_step; the host backend always calls decide(). Both must come to the same
  // decision: evaluate_rule(device_rule(id), statistics of the query) == decide(query).
  // Default: none (the host decides).
  virtual std::optional<ScaleRule> device_rule(int /*layer_id*/) const { return std::nullopt; }
  // The decision a device made at `layer_id` from device_rule: take it as decide() would have.
  virtual void accept(int /*layer_id*/, const LocalScale& /*decision*/) {}
  // Optional (SPEC §6.5): whether the controller chooses a factor r (a power of two) for each layer's
  // weight and bias gradients, stored as r·xᵀg and unscaled by r·S_in. Default: no — they are stored at
  // the scale the layer received (SPEC §5 step 3), and weight_grad_scale is never asked.
  virtual bool scales_weight_grads() const { return false; }
  // r, when scales_weight_grads(). Default: the largest power of two that keeps max|r·xᵀg| within the
  // format's largest finite value (weight_grad_range_scale), so a weight gradient never overflows where
  // the activation gradient's scale is right, and small ones keep the format's whole range.
  virtual double weight_grad_scale(const WeightGradQuery& q);
  // Optional: u_max when weight_grad_scale at `layer_id` is weight_grad_range_scale(max_abs, u_max, S_in)
  // (lib/scaler/scale_rule.h), so a device backend evaluates it where the maxima are, without the host
  // waiting. Default: none (the host decides from the maxima).
  virtual std::optional<double> device_weight_grad_bound(int /*layer_id*/) const { return std::nullopt; }
  // After backward: what every layer did and observed (records indexed by layer id; full statistics
  // only on recording steps, s/S and max|g| always), and whether the iteration overflowed.
  virtual void end_step(const StepMonitor& monitor) = 0;
  // Optional, for a controller that runs under a loss-level policy it does not implement itself
  // ({"policy": "adaptive", "controller": NAME}): its own caches and counters, saved and restored
  // with the policy's; restore_controller_state(controller_state()) must continue bit-identically.
  // Default: no state (null), and only null is accepted back.
  virtual nlohmann::json controller_state() const { return nullptr; }
  virtual void restore_controller_state(const nlohmann::json& state);
};

}  // namespace gradscale
