// The CUDA backend's layers (see layers.h).
#include "lib/cuda/layers.h"

#include "lib/cuda/backend.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/relu.h"

namespace gradscale::cuda {
namespace {

// What every twin shares: the host layer for its description, and device copies of its parameters.
class DeviceLayer : public Layer {
 public:
  DeviceLayer(CudaBackend& backend, std::unique_ptr<Layer> host)
      : Layer(host->name()), backend_(backend), host_(std::move(host)) {
    id_ = host_->id();
    for (Parameter* p : host_->parameters()) {
      auto d = std::make_unique<Parameter>();
      d->name = p->name;
      d->value = p->value.to(backend_.memory());
      d->grad = p->grad.to(backend_.memory());
      d->weight_decay = p->weight_decay;
      params_.push_back(std::move(d));
    }
  }
  std::string kind() const override { return host_->kind(); }
  int num_inputs() const override { return host_->num_inputs(); }
  Shape output_shape(const std::vector<Shape>& inputs) const override { return host_->output_shape(inputs); }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> ps;
    for (auto& p : params_) ps.push_back(p.get());
    return ps;
  }
  nlohmann::json describe() const override { return host_->describe(); }
  std::int64_t reduction_length() const override { return host_->reduction_length(); }

 protected:
  Tensor device_tensor() { return Tensor(backend_.memory()); }

  CudaBackend& backend_;
  std::unique_ptr<Layer> host_;
  std::vector<std::unique_ptr<Parameter>> params_;
};

// y = x·Wᵀ + b with cuBLAS (fp32 operands holding values in F, fp32 accumulation); backward as
// lib/layers/linear.cpp: o = g·W in fp32 then the controller's s and one rounding, dW = gᵀ·x, db = Σ g.
class CudaLinear final : public DeviceLayer {
 public:
  CudaLinear(CudaBackend& backend, std::unique_ptr<Layer> host)
      : DeviceLayer(backend, std::move(host)),
        weight_work_(device_tensor()),
        bias_work_(device_tensor()),
        grad_w_(device_tensor()),
        grad_b_(device_tensor()),
        ones_(device_tensor()) {
    const nlohmann::json d = host_->describe();
    in_ = d.at("in").get<std::int64_t>();
    out_ = d.at("out").get<std::int64_t>();
    has_bias_ = d.at("bias").get<bool>();
  }

  void prepare_weights(const Precision& p) override {
    backend_.round_working_copy(*params_[0], weight_work_, p);
    if (has_bias_) backend_.round_working_copy(*params_[1], bias_work_, p);
  }

  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    const std::int64_t n = x.dim(0);
    output.resize(output_shape({x.shape()}));
    CudaContext& c = backend_.context();
    gemm(c, n, out_, in_, 1.0f, {x.data()}, {weight_work_.data(), DeviceType::f32, true}, 0.0f, {output.data()});
    if (has_bias_) {  // y += 1·b: one exact product per element, then the CPU's one fp32 sum
      ensure_ones(n);
      gemm(c, n, out_, 1, 1.0f, {ones_.data()}, {bias_work_.data()}, 1.0f, {output.data()});
    }
    backend_.round_output(output, ctx.precision);
  }

  void backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    const std::int64_t n = x.dim(0);
    const Tensor& g = grad_output.g;
    CudaContext& c = backend_.context();
    if (ScaledGrad* gx = grad_inputs[0]) {
      gx->g.resize(x.shape());
      gemm(c, n, in_, out_, 1.0f, {g.data()}, {weight_work_.data()}, 0.0f, {gx->g.data()});
      const std::int64_t out = out_, in = in_;
      const UpstreamProduct product{weight_work_, out_, [&g, this, n, out, in] {
                                      const Tensor hg = g.to_host(), hw = weight_work_.to_host();
                                      return dense_product_range(hg.data(), n, out, hw.data(), in);
                                    }};
      backend_.scale_upstream_grad(*this, grad_output, product, *gx, ctx);
    }
    grad_w_.resize(params_[0]->value.shape());
    gemm(c, out_, in_, n, 1.0f, {g.data(), DeviceType::f32, true}, {x.data()}, 0.0f, {grad_w_.data()});
    backend_.accumulate_weight_grad(grad_w_, grad_output.scale, *params_[0], id_, ctx.precision, ctx.monitor);
    if (has_bias_) {
      ensure_ones(n);
      grad_b_.resize(params_[1]->value.shape());
      gemm(c, 1, out_, n, 1.0f, {ones_.data()}, {g.data()}, 0.0f, {grad_b_.data()});
      backend_.accumulate_weight_grad(grad_b_, grad_output.scale, *params_[1], id_, ctx.precision, ctx.monitor);
    }
  }

 private:
  void ensure_ones(std::int64_t n) {
    if (ones_.size() != n) ones_.reset({n}, 1.0f);
  }

  std::int64_t in_ = 0, out_ = 0;
  bool has_bias_ = false;
  Tensor weight_work_, bias_work_, grad_w_, grad_b_, ones_;
};

// ReLU selects values: exact in every format, the gradient keeps its scale (lib/layers/relu.cpp).
class CudaReLU final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) override {
    const Tensor& x = *inputs[0];
    output.resize(x.shape());
    relu_forward(x.data(), output.data(), static_cast<std::size_t>(x.size()), backend_.context().stream());
  }
  void backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext&) override {
    ScaledGrad* gx = grad_inputs[0];
    if (!gx) return;
    gx->g.resize(output.shape());
    relu_backward(output.data(), grad_output.g.data(), gx->g.data(), static_cast<std::size_t>(output.size()),
                  backend_.context().stream());
    gx->scale = grad_output.scale;
  }
};

// Flatten copies (lib/layers/relu.cpp).
class CudaFlatten final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) override {
    const Tensor& x = *inputs[0];
    output.copy_from(x);
    output.resize(output_shape({x.shape()}));  // same size: a new shape on the same storage
  }
  void backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext&) override {
    ScaledGrad* gx = grad_inputs[0];
    if (!gx) return;
    gx->g.copy_from(grad_output.g);
    gx->g.resize(inputs[0]->shape());
    gx->scale = grad_output.scale;
  }
};

// y = round(a + b); the gradient goes to both inputs at its scale (lib/layers/add.cpp).
class CudaAdd final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    GS_CHECK_SHAPE(inputs.size() == 2, "layer '" << name_ << "' (add) takes two inputs, got " << inputs.size());
    output.resize(output_shape({inputs[0]->shape(), inputs[1]->shape()}));
    add(inputs[0]->data(), inputs[1]->data(), output.data(), static_cast<std::size_t>(output.size()),
        backend_.context().stream());
    backend_.round_output(output, ctx.precision);
  }
  void backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext&) override {
    GS_CHECK_SHAPE(grad_inputs.size() == 2 && grad_output.g.shape() == output.shape(),
                   "layer '" << name_ << "': output gradient " << shape_string(grad_output.g.shape())
                             << " does not match output " << shape_string(output.shape()));
    for (ScaledGrad* gx : grad_inputs) {
      if (!gx) continue;
      gx->g.copy_from(grad_output.g);
      gx->scale = grad_output.scale;
    }
  }
};

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
    backend_.finish_backward(ctx.monitor);  // the queued records first: the CPU's order
    grad_output_.g.copy_from(grad_output.g);
    grad_output_.scale = grad_output.scale;
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

bool runs_on_gpu(const std::string& kind) {
  return kind == "linear" || kind == "relu" || kind == "flatten" || kind == "add";
}

std::unique_ptr<Layer> adopt_layer(CudaBackend& backend, std::unique_ptr<Layer> layer) {
  const std::string kind = layer->kind();
  if (kind == "linear") return std::make_unique<CudaLinear>(backend, std::move(layer));
  if (kind == "relu") return std::make_unique<CudaReLU>(backend, std::move(layer));
  if (kind == "flatten") return std::make_unique<CudaFlatten>(backend, std::move(layer));
  if (kind == "add") return std::make_unique<CudaAdd>(backend, std::move(layer));
  return std::make_unique<HostLayer>(backend, std::move(layer));
}

}  // namespace gradscale::cuda
