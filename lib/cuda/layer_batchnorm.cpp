// The CUDA twin of BatchNorm (see device_layer.h).

#include "lib/cuda/device_layer.h"

#include "lib/cuda/batchnorm.h"

namespace gradscale::cuda {
namespace {

// Batch normalisation (lib/layers/batchnorm.cpp) with the lib/cuda kernels: statistics in double, the
// output rounded to F; backward linear in g, so the input gradient keeps S and is rounded once, and dγ,
// dβ are rounded and unscaled like weight gradients. The running statistics live on the device and are
// the layer's buffers (checkpoints stage them through the host).
class CudaBatchNorm final : public DeviceLayer {
 public:
  CudaBatchNorm(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : DeviceLayer(backend, std::move(host), placement),
        gamma_work_(device_tensor()),
        beta_work_(device_tensor()),
        grad_gamma_(device_tensor()),
        grad_beta_(device_tensor()) {
    const nlohmann::json d = host_->describe();
    channels_ = d.at("channels").get<std::int64_t>();
    eps_ = d.at("eps").get<double>();
    momentum_ = d.at("momentum").get<double>();
    for (const auto& [name, t] : host_->buffers()) buffers_.emplace_back(name, t->to(backend_.memory()));
    GS_CHECK(buffers_.size() == 2,
             "layer '" << name_ << "': batchnorm has running mean and variance buffers");
    mean_.resize(static_cast<std::size_t>(channels_));
    invstd_.resize(static_cast<std::size_t>(channels_));
  }

  void prepare_weights(const Precision& p) override {
    backend_.round_working_copy(*params_[0], gamma_work_, p);
    backend_.round_working_copy(*params_[1], beta_work_, p);
  }
  std::vector<std::pair<std::string, Tensor*>> buffers() override {
    return {{buffers_[0].first, &buffers_[0].second}, {buffers_[1].first, &buffers_[1].second}};
  }

  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    output.resize(output_shape({x.shape()}));
    GS_CHECK(gamma_work_.size() == channels_, "layer '" << name_ << "': prepare_weights() was not called");
    const BatchNormShape s = shape_of(x);
    cudaStream_t stream = backend_.context().stream();
    last_training_ = ctx.training;
    float* running_mean = buffers_[0].second.data();
    float* running_var = buffers_[1].second.data();
    if (ctx.training) {
      GS_CHECK_SHAPE(s.n * s.plane > 1,
                     "layer '" << name_ << "': training needs more than one value per channel, got input "
                               << shape_string(x.shape()));
      batchnorm_forward_training(backend_.context(), x.data(), s, gamma_work_.data(), beta_work_.data(), eps_,
                                 momentum_, running_mean, running_var, mean_.data(), invstd_.data(),
                                 output.data());
    } else {
      batchnorm_forward_eval(x.data(), s, gamma_work_.data(), beta_work_.data(), running_mean, running_var,
                             eps_, mean_.data(), invstd_.data(), output.data(), stream);
    }
    backend_.round_output(output, ctx.precision);
  }

  void backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    GS_CHECK_SHAPE(grad_output.g.shape() == x.shape(),
                   "layer '" << name_ << "': output gradient " << shape_string(grad_output.g.shape())
                             << " does not match input " << shape_string(x.shape()));
    ScaledGrad* gx = grad_inputs[0];
    if (gx) gx->g.resize(x.shape());
    grad_gamma_.resize(params_[0]->value.shape());
    grad_beta_.resize(params_[1]->value.shape());
    batchnorm_backward(backend_.context(), x.data(), grad_output.g.data(), shape_of(x), gamma_work_.data(),
                       mean_.data(), invstd_.data(), last_training_, gx ? gx->g.data() : nullptr,
                       grad_gamma_.data(), grad_beta_.data());
    if (gx) {
      backend_.round_activation_grad(gx->g, id_, ctx.precision, ctx.monitor);
      pass_scale(*gx, grad_output);
    }
    backend_.accumulate_weight_grads(*this, {{&grad_gamma_, params_[0].get()}, {&grad_beta_, params_[1].get()}}, grad_output, ctx);
  }

 private:
  BatchNormShape shape_of(const Tensor& x) const {
    return {x.dim(0), channels_, x.rank() == 4 ? x.dim(2) * x.dim(3) : 1};
  }

  std::int64_t channels_ = 0;
  double eps_ = 1e-5, momentum_ = 0.1;
  bool last_training_ = true;
  Tensor gamma_work_, beta_work_, grad_gamma_, grad_beta_;
  std::vector<std::pair<std::string, Tensor>> buffers_;  // running mean and variance, [C] on the device
  DeviceBuffer<double> mean_, invstd_;                   // the statistics the last forward normalised with
};

}  // namespace

std::unique_ptr<Layer> make_batchnorm_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                           const LayerPlacement& placement) {
  return std::make_unique<CudaBatchNorm>(backend, std::move(host), placement);
}

}  // namespace gradscale::cuda
