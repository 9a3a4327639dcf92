// A user's own layer inside a model on the GPU (see device_layer.h).
#include "lib/cuda/device_layer.h"

namespace gradscale::cuda {
namespace {

// A host layer inside a model on the GPU: its inputs are copied to the host, it runs there with the CPU
// backend's numerics (its parameters stay on the host, where the optimizer updates them), and its
// output and input gradients are copied back. Before its backward the backend's queued measurements
// are entered into the monitor, so found_inf and the records keep the CPU's order.
class HostLayer final : public Layer {
 public:
  HostLayer(CudaBackend& backend, std::unique_ptr<Layer> host)
      : Layer(host->name()), backend_(backend), host_(std::move(host)) {
    id_ = host_->id();
  }
  std::string kind() const override { return host_->kind(); }
  int num_inputs() const override { return host_->num_inputs(); }
  Shape output_shape(const std::vector<Shape>& inputs) const override { return host_->output_shape(inputs); }
  std::vector<Parameter*> parameters() override { return host_->parameters(); }
  void prepare_weights(const Precision& p) override { host_->prepare_weights(p); }
  std::vector<std::pair<std::string, Tensor*>> buffers() override { return host_->buffers(); }
  nlohmann::json describe() const override { return host_->describe(); }
  std::int64_t reduction_length() const override { return host_->reduction_length(); }
  bool output_in_format(bool in) const override { return host_->output_in_format(in); }
  bool input_grads_in_format(bool out) const override { return host_->input_grads_in_format(out); }

  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    host_->set_id(id_);
    inputs_.resize(inputs.size());
    std::vector<const Tensor*> ins;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      inputs_[i].copy_from(*inputs[i]);
      ins.push_back(&inputs_[i]);
    }
    host_->forward(ins, output_, ctx);
    output.copy_from(output_);
  }

  void backward(const std::vector<const Tensor*>&, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    backend_.enter_measurements(ctx.monitor);  // the queued records first: the CPU's order
    grad_output_.g.copy_from(grad_output.g);
    grad_output_.scale = backend_.host_scale(grad_output, ctx.monitor);  // known after enter_measurements
    grads_.resize(grad_inputs.size());
    std::vector<const Tensor*> ins;
    std::vector<ScaledGrad*> gis;
    for (std::size_t i = 0; i < grad_inputs.size(); ++i) {
      ins.push_back(&inputs_[i]);
      gis.push_back(grad_inputs[i] ? &grads_[i] : nullptr);
    }
    host_->backward(ins, output_, grad_output_, gis, ctx);
    for (std::size_t i = 0; i < grad_inputs.size(); ++i) {
      if (!grad_inputs[i]) continue;
      grad_inputs[i]->g.copy_from(grads_[i].g);
      grad_inputs[i]->scale = grads_[i].scale;
      grad_inputs[i]->device_scale = -1;  // the host layer's own value
    }
  }

 private:
  CudaBackend& backend_;
  std::unique_ptr<Layer> host_;
  std::vector<Tensor> inputs_;  // host copies of the last forward's inputs
  Tensor output_;
  ScaledGrad grad_output_;
  std::vector<ScaledGrad> grads_;
};

}  // namespace

std::unique_ptr<Layer> make_host_layer(CudaBackend& backend, std::unique_ptr<Layer> host) {
  return std::make_unique<HostLayer>(backend, std::move(host));
}

}  // namespace gradscale::cuda
