// A model: a DAG of layers in definition (topological) order. Forward stores every node's output;
// backward walks the nodes in reverse, joining the scaled gradients that arrive at forked tensors with
// the rule of SPEC §5 before handing them to the producing layer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/layers/layer.h"
#include "lib/scaler/controller.h"

namespace gradscale {
class Backend;
}

namespace gradscale {

class Model {
 public:
  static constexpr int kModelInput = -1;

  Model();  // on cpu_backend()
  explicit Model(std::string name);  // the same, named

  // What the model is called where a run is described (a trace's header "model", `gradscale inspect`):
  // build_model takes it from the spec's "name"; empty until set.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // Appends a layer fed by the given nodes (kModelInput = the model's input). Returns its node id,
  // which is also the layer's id. Inputs must be earlier nodes.
  int add(std::unique_ptr<Layer> layer, std::vector<int> inputs);
  // Checks the graph and infers every shape for a per-sample input shape ([C, H, W] or [F]).
  // The last node is the output (logits [N, classes]). A layer built from Options without its input
  // size (Linear::Options, Conv2d::Options, BatchNorm::Options) takes it from the graph here, and its
  // weights are drawn from `init_rng`, in layer order — the draws the positional constructors make
  // when the layers are constructed in that order with that generator.
  void finalize(const Shape& sample_shape);
  void finalize(const Shape& sample_shape, Rng& init_rng);

  // Moves the finalized model to `backend` (lib/backend): every layer is replaced by its twin there, with
  // the same parameter values, and activations and gradients live in the backend's memory from then on.
  // The backend must outlive the model. Before the first forward; the default is cpu_backend().
  void use_backend(Backend& backend);
  Backend& backend() const { return *backend_; }
  // What the graph guarantees about each layer's operands, by node id (see LayerPlacement): what
  // use_backend hands to Backend::adopt.
  std::vector<LayerPlacement> placement() const;
  Device device() const;

  // Working weights = quantize(master, F) for every layer; call once per step before forward.
  void prepare_weights(const Precision& p);
  // Runs every layer; returns the output node's tensor (owned by the model, valid until next forward).
  // The input and the output are in the backend's memory (device()).
  const Tensor& forward(const Tensor& input, ForwardContext& ctx);
  // Backward from the scaled gradient of the output of the last forward (whose input must still be
  // alive). Parameter gradients are added to Parameter::grad. A layer is asked for the gradient of an
  // input only when some parameter lies on or before that input (never for the model input itself).
  void backward(const ScaledGrad& grad_output, BackwardContext& ctx);
  void zero_grads();

  std::vector<Parameter*> parameters();
  std::vector<std::pair<std::string, Tensor*>> buffers();
  int num_layers() const { return static_cast<int>(nodes_.size()); }
  Layer& layer(int id) { return *nodes_[static_cast<std::size_t>(id)].layer; }
  const Shape& sample_shape() const { return sample_shape_; }
  // The number of classes the model outputs: the last layer's [N, classes] (after finalize).
  std::int64_t classes() const { return classes_; }
  std::int64_t num_parameters();
  // The layer table of traces: id, name, kind, inputs, parameter shapes, K.
  nlohmann::json layer_table() const;
  // The layer table as a controller is bound to it (Scaler::bind).
  std::vector<LayerInfo> layer_infos() const;

  // Per-layer wall-clock profile (for `gradscale bench step`): while enabled, forward and backward
  // add each layer's seconds to its entry (backward includes the join of its
  // consumers' gradients); off by default (then the cost is one branch per layer).
  struct LayerTime {
    double forward = 0, backward = 0;  // seconds, summed since the last reset
  };
  void set_profiling(bool on);
  const std::vector<LayerTime>& layer_times() const { return layer_times_; }

 private:
  struct Node {
    std::unique_ptr<Layer> layer;
    std::vector<int> inputs;
    std::vector<int> input_slot;  // for each input edge, the slot in the input node's pending list
    int consumers = 0;
    bool needs_grad = false;  // some parameter lies on or before this node: its output gradient is used
  };
  void allocate_activations();
  void finalize_with(const Shape& sample_shape, Rng* init_rng);

  std::vector<Node> nodes_;
  std::string name_;
  Backend* backend_;
  Shape sample_shape_;
  std::int64_t classes_ = 0;
  bool finalized_ = false;
  std::vector<Tensor> outputs_;
  std::vector<std::vector<ScaledGrad>> pending_;  // per node: one slot per consumer edge
  std::vector<ScaledGrad> joined_;                // per node: the joined gradient when consumers > 1
  const Tensor* last_input_ = nullptr;            // the input of the last forward, read by backward
  bool profiling_ = false;
  std::vector<LayerTime> layer_times_;  // per node, while profiling
};

}  // namespace gradscale
