// Model graph execution (see model.h).
#include "lib/model/model.h"

#include <algorithm>
#include <chrono>

#include "lib/backend/backend.h"
#include "lib/model/join.h"

namespace gradscale {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Model::Model() : backend_(&cpu_backend()) {}

Model::Model(std::string name) : name_(std::move(name)), backend_(&cpu_backend()) {}

int Model::add(std::unique_ptr<Layer> layer, std::vector<int> inputs) {
  GS_CHECK(!finalized_, "model already finalized");
  const int id = static_cast<int>(nodes_.size());
  GS_CHECK_CONFIG(static_cast<int>(inputs.size()) == layer->num_inputs(),
                  "layer '" << layer->name() << "' (" << layer->kind() << ") takes " << layer->num_inputs()
                            << " input(s), got " << inputs.size());
  for (int in : inputs)
    GS_CHECK_CONFIG(in == kModelInput || (in >= 0 && in < id),
                    "layer '" << layer->name() << "': input node " << in << " is not an earlier layer");
  for (const Node& n : nodes_)
    GS_CHECK_CONFIG(n.layer->name() != layer->name(), "duplicate layer name '" << layer->name() << "'");
  layer->set_id(id);
  nodes_.push_back(Node{std::move(layer), std::move(inputs), {}, 0});
  return id;
}

void Model::finalize(const Shape& sample_shape) {
  finalize_with(sample_shape, nullptr);
}

void Model::finalize(const Shape& sample_shape, Rng& init_rng) {
  finalize_with(sample_shape, &init_rng);
}

void Model::finalize_with(const Shape& sample_shape, Rng* init_rng) {
  GS_CHECK_CONFIG(!nodes_.empty(), "model has no layers");
  sample_shape_ = sample_shape;
  Shape input = {1};
  input.insert(input.end(), sample_shape.begin(), sample_shape.end());
  std::vector<Shape> shapes(nodes_.size());
  for (Node& n : nodes_) n.consumers = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    std::vector<Shape> in_shapes;
    n.input_slot.clear();
    for (int in : n.inputs) {
      in_shapes.push_back(in == kModelInput ? input : shapes[static_cast<std::size_t>(in)]);
      n.input_slot.push_back(in == kModelInput ? 0 : nodes_[static_cast<std::size_t>(in)].consumers++);
    }
    n.layer->infer_sizes(in_shapes, init_rng);
    shapes[i] = n.layer->output_shape(in_shapes);
    n.needs_grad = !n.layer->parameters().empty();
    for (int in : n.inputs)
      n.needs_grad = n.needs_grad || (in != kModelInput && nodes_[static_cast<std::size_t>(in)].needs_grad);
  }
  for (std::size_t i = 0; i + 1 < nodes_.size(); ++i)
    GS_CHECK_CONFIG(
        nodes_[i].consumers > 0,
        "layer '" << nodes_[i].layer->name() << "' feeds nothing (only the last layer may be the output)");
  const Shape& out = shapes.back();
  GS_CHECK_CONFIG(out.size() == 2, "the last layer '" << nodes_.back().layer->name()
                                                      << "' must output [N, classes], got "
                                                      << shape_string(out));
  classes_ = out[1];
  allocate_activations();
  finalized_ = true;
}

void Model::allocate_activations() {
  DeviceMemory* memory = backend_->memory();
  outputs_.assign(nodes_.size(), Tensor(memory));
  pending_.assign(nodes_.size(), {});
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    pending_[i].assign(static_cast<std::size_t>(std::max(1, nodes_[i].consumers)), ScaledGrad{Tensor(memory)});
  joined_.assign(nodes_.size(), ScaledGrad{Tensor(memory)});
  last_input_ = nullptr;
}

void Model::use_backend(Backend& backend) {
  GS_CHECK(finalized_, "Model::use_backend before finalize");
  if (&backend == backend_) return;
  GS_CHECK_CONFIG(backend_->device() == Device::cpu,
                  "Model::use_backend: the model already runs on " << backend_->description()
                                                                   << " (move a model from the host only)");
  const std::vector<LayerPlacement> placements = placement();
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    const int id = n.layer->id();
    n.layer = backend.adopt(std::move(n.layer), placements[i]);
    n.layer->set_id(id);
  }
  backend_ = &backend;
  allocate_activations();
}

std::vector<LayerPlacement> Model::placement() const {
  GS_CHECK(finalized_, "Model::placement before finalize");
  const std::size_t count = nodes_.size();
  std::vector<LayerPlacement> placements(count);
  std::vector<bool> output_in_format(count);
  for (std::size_t i = 0; i < count; ++i) {  // forward: the model input is fp32 data
    bool in_format = true;
    for (int in : nodes_[i].inputs)
      in_format = in_format && in != kModelInput && output_in_format[static_cast<std::size_t>(in)];
    placements[i].inputs_in_format = in_format;
    output_in_format[i] = nodes_[i].layer->output_in_format(in_format);
  }
  // Backward: the loss gradient and a join are rounded to the gradient format; a node with one consumer
  // gets that consumer's input gradient.
  for (std::size_t i = count; i-- > 0;) {
    const Node& n = nodes_[i];
    if (i + 1 == count || n.consumers != 1) {
      placements[i].output_grad_in_format = true;
      continue;
    }
    for (std::size_t c = i + 1; c < count; ++c) {
      const std::vector<int>& ins = nodes_[c].inputs;
      if (std::find(ins.begin(), ins.end(), static_cast<int>(i)) == ins.end()) continue;
      placements[i].output_grad_in_format =
          nodes_[c].layer->input_grads_in_format(placements[c].output_grad_in_format);
      break;
    }
  }
  return placements;
}

Device Model::device() const { return backend_->device(); }

void Model::prepare_weights(const Precision& p) {
  // The backend may queue the layers' roundings until the end (one launch on a GPU); a layer that throws
  // still ends the bracket, so nothing stays queued.
  Backend& b = backend();
  b.begin_prepare_weights();
  try {
    for (Node& n : nodes_) n.layer->prepare_weights(p);
  } catch (...) {
    b.end_prepare_weights();
    throw;
  }
  b.end_prepare_weights();
}

const Tensor& Model::forward(const Tensor& input, ForwardContext& ctx) {
  GS_CHECK(finalized_, "forward before finalize");
  Shape expect = {input.dim(0)};
  expect.insert(expect.end(), sample_shape_.begin(), sample_shape_.end());
  GS_CHECK_SHAPE(input.shape() == expect,
                 "model input " << shape_string(input.shape()) << ", expected " << shape_string(expect));
  GS_CHECK_CONFIG(input.device() == device(), "model input in " << device_name(input.device())
                                                                << " memory, the model runs on "
                                                                << backend_->description());
  last_input_ = &input;
  std::vector<const Tensor*> ins;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    ins.clear();
    for (int in : n.inputs)
      ins.push_back(in == kModelInput ? &input : &outputs_[static_cast<std::size_t>(in)]);
    const auto t0 = profiling_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    n.layer->forward(ins, outputs_[i], ctx);
    if (profiling_) {
      backend_->synchronize();  // a device's kernels run asynchronously: time them, not their launch
      layer_times_[i].forward += seconds_since(t0);
    }
  }
  return outputs_.back();
}

void Model::backward(const ScaledGrad& grad_output, BackwardContext& ctx) {
  GS_CHECK(finalized_, "backward before finalize");
  std::vector<const Tensor*> ins;
  std::vector<ScaledGrad*> grad_ins;
  std::vector<const ScaledGrad*> parts;
  // The model input, and nodes with no parameter on or before them, get no gradient.
  for (std::size_t k = nodes_.size(); k-- > 0;) {
    Node& n = nodes_[k];
    if (!n.needs_grad) continue;  // nothing to differentiate on or before this node
    const auto t0 = profiling_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const ScaledGrad* g = &grad_output;
    if (k + 1 < nodes_.size()) {
      if (n.consumers == 1) {
        g = &pending_[k][0];
      } else {
        parts.clear();
        for (const ScaledGrad& p : pending_[k]) parts.push_back(&p);
        // data-parallel (a reducer): the join's maxima over the ranks
        backend_->join(parts, joined_[k], ctx.precision, ctx.monitor, static_cast<int>(k), ctx.reducer);
        g = &joined_[k];
      }
    }
    ins.clear();
    grad_ins.clear();
    for (std::size_t e = 0; e < n.inputs.size(); ++e) {
      const int in = n.inputs[e];
      const auto i = static_cast<std::size_t>(in);
      ins.push_back(in == kModelInput ? last_input_ : &outputs_[i]);
      grad_ins.push_back(in == kModelInput || !nodes_[i].needs_grad
                             ? nullptr
                             : &pending_[i][static_cast<std::size_t>(n.input_slot[e])]);
    }
    backend_->note_backward(static_cast<int>(k), *g, ctx.monitor);
    n.layer->backward(ins, outputs_[k], *g, grad_ins, ctx);
    if (profiling_) {
      backend_->synchronize();
      layer_times_[k].backward += seconds_since(t0);
    }
  }
}

void Model::set_profiling(bool on) {
  profiling_ = on;
  layer_times_.assign(nodes_.size(), LayerTime{});
}

void Model::zero_grads() {
  for (Parameter* p : parameters()) p->grad.fill(0.0f);
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> ps;
  for (Node& n : nodes_)
    for (Parameter* p : n.layer->parameters()) ps.push_back(p);
  return ps;
}

std::vector<std::pair<std::string, Tensor*>> Model::buffers() {
  std::vector<std::pair<std::string, Tensor*>> bs;
  for (Node& n : nodes_)
    for (auto& b : n.layer->buffers()) bs.push_back(b);
  return bs;
}

std::int64_t Model::num_parameters() {
  std::int64_t total = 0;
  for (Parameter* p : parameters()) total += p->value.size();
  return total;
}

std::vector<LayerInfo> Model::layer_infos() const {
  std::vector<LayerInfo> infos;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Layer& l = *nodes_[i].layer;
    LayerInfo info;
    info.id = static_cast<int>(i);
    info.name = l.name();
    info.kind = l.kind();
    info.reduction = l.reduction_length();
    info.parametric = info.reduction > 0;
    const std::vector<Parameter*> ps = l.parameters();
    if (info.parametric && !ps.empty()) info.weight_shape = ps[0]->value.shape();
    info.inputs = nodes_[i].inputs;
    infos.push_back(std::move(info));
  }
  return infos;
}

nlohmann::json Model::layer_table() const {
  nlohmann::json table = nlohmann::json::array();
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    nlohmann::json row = n.layer->describe();
    row["id"] = i;
    row["inputs"] = n.inputs;
    row["K"] = n.layer->reduction_length();
    row["parametric"] = n.layer->reduction_length() > 0;
    nlohmann::json params = nlohmann::json::array();
    for (Parameter* p : n.layer->parameters())
      params.push_back({{"name", p->name}, {"shape", p->value.shape()}});
    row["parameters"] = params;
    table.push_back(row);
  }
  return table;
}

}  // namespace gradscale
