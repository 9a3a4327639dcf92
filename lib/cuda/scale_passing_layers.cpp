// The CUDA twins of the layers without parameters whose backward keeps the scale S (SPEC §5): ReLU,
// Flatten, Add, MaxPool2d, GlobalAvgPool, Dropout (see device_layer.h).
#include <cstdint>
#include <vector>

#include "lib/cuda/device_layer.h"

#include "lib/core/random.h"
#include "lib/cuda/avgpool.h"
#include "lib/cuda/dropout.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/maxpool.h"
#include "lib/cuda/relu.h"
#include "lib/layers/dropout.h"
#include "lib/layers/pool.h"

namespace gradscale::cuda {
namespace {

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
    pass_scale(*gx, grad_output);
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
    pass_scale(*gx, grad_output);
  }
};

// y = round(a + b); the gradient goes to both inputs at its scale (lib/layers/add.cpp).
class CudaAdd final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    GS_CHECK_SHAPE(inputs.size() == 2,
                   "layer '" << name_ << "' (add) takes two inputs, got " << inputs.size());
    output.resize(output_shape({inputs[0]->shape(), inputs[1]->shape()}));
    add(inputs[0]->data(), inputs[1]->data(), output.data(), static_cast<std::size_t>(output.size()),
        backend_.context().stream());
    backend_.round_output(output, ctx.precision);
  }
  void backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext&) override {
    GS_CHECK_SHAPE(grad_inputs.size() == 2,
                   "layer '" << name_ << "' (add): " << grad_inputs.size() << " input gradients, not 2");
    check_output_grad(*this, grad_output.g, output);
    for (ScaledGrad* gx : grad_inputs) {
      if (!gx) continue;
      gx->g.copy_from(grad_output.g);
      pass_scale(*gx, grad_output);
    }
  }
};

// Max pooling selects values (lib/layers/pool.cpp): exact, the scale S passes; the gradient is rounded
// again only where windows overlap (sums of several gradients).
class CudaMaxPool2d final : public DeviceLayer {
 public:
  CudaMaxPool2d(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : DeviceLayer(backend, std::move(host), placement) {
    const nlohmann::json d = host_->describe();
    kernel_ = d.at("kernel").get<std::int64_t>();
    stride_ = d.at("stride").get<std::int64_t>();
  }
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) override {
    const Tensor& x = *inputs[0];
    output.resize(output_shape({x.shape()}));
    argmax_.resize(static_cast<std::size_t>(output.size()));
    max_pool_forward(x.data(), geometry(x), output.data(), argmax_.data(), backend_.context().stream());
  }
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    ScaledGrad* gx = grad_inputs[0];
    if (!gx) return;
    const Tensor& x = *inputs[0];
    check_max_pool_grad(*this, grad_output.g, output, argmax_.size());
    gx->g.resize(x.shape());
    max_pool_backward(grad_output.g.data(), argmax_.data(), geometry(x), gx->g.data(),
                      backend_.context().stream());
    if (stride_ < kernel_) backend_.round_activation_grad(gx->g, id_, ctx.precision, ctx.monitor);
    pass_scale(*gx, grad_output);
  }

 private:
  PoolGeometry geometry(const Tensor& x) const {
    return {x.dim(0) * x.dim(1), x.dim(2), x.dim(3), kernel_, stride_};
  }
  std::int64_t kernel_ = 2, stride_ = 2;
  DeviceBuffer<std::int32_t> argmax_;  // per output: the index of its maximum in the H×W plane
};

// The spatial mean, rounded to F; backward g / (H·W) rounded to F at the unchanged scale S.
class CudaGlobalAvgPool final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    output.resize(output_shape({x.shape()}));
    global_avg_pool_forward(x.data(), output.size(), x.dim(2) * x.dim(3), output.data(),
                            backend_.context().stream());
    backend_.round_output(output, ctx.precision);
  }
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    ScaledGrad* gx = grad_inputs[0];
    if (!gx) return;
    const Tensor& x = *inputs[0];
    check_output_grad(*this, grad_output.g, output);
    gx->g.resize(x.shape());
    global_avg_pool_backward(grad_output.g.data(), output.size(), x.dim(2) * x.dim(3), gx->g.data(),
                             backend_.context().stream());
    backend_.round_activation_grad(gx->g, id_, ctx.precision, ctx.monitor);
    pass_scale(*gx, grad_output);
  }
};

// Dropout (lib/layers/dropout.cpp): the mask is drawn on the host from the run's generator, one uniform
// per element as on the CPU, and applied on the device; output and gradient are rounded to F again.
class CudaDropout final : public DeviceLayer {
 public:
  CudaDropout(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : DeviceLayer(backend, std::move(host), placement) {
    p_ = host_->describe().at("p").get<double>();
    factor_ = static_cast<float>(1.0 / (1.0 - p_));
  }
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    output.resize(output_shape({x.shape()}));
    masked_ = ctx.training && p_ > 0;
    if (!masked_) {
      output.copy_from(x);
      return;
    }
    GS_CHECK(ctx.rng != nullptr, "layer '" << name_ << "' (dropout) needs ForwardContext::rng when training");
    const auto n = static_cast<std::size_t>(x.size());
    mask_.resize(n);
    for (std::size_t i = 0; i < n; ++i) mask_[i] = uniform01(*ctx.rng) >= p_ ? 1 : 0;
    keep_.resize(n);
    // From pageable memory the copy is staged before the call returns: no wait, and mask_ may be reused.
    GS_CUDA_CHECK(cudaMemcpyAsync(keep_.data(), mask_.data(), n * sizeof(std::uint8_t),
                                  cudaMemcpyHostToDevice, backend_.context().stream()));
    apply_dropout_mask(x.data(), keep_.data(), factor_, output.data(), n, backend_.context().stream());
    backend_.round_output(output, ctx.precision);
  }
  void backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    ScaledGrad* gx = grad_inputs[0];
    if (!gx) return;
    const Tensor& x = *inputs[0];
    check_dropout_grad(*this, grad_output.g, x, masked_, keep_.size());
    if (masked_) {
      gx->g.resize(x.shape());
      apply_dropout_mask(grad_output.g.data(), keep_.data(), factor_, gx->g.data(), keep_.size(),
                         backend_.context().stream());
      backend_.round_activation_grad(gx->g, id_, ctx.precision, ctx.monitor);
    } else {
      gx->g.copy_from(grad_output.g);
    }
    pass_scale(*gx, grad_output);
  }

 private:
  double p_ = 0;
  float factor_ = 1;
  bool masked_ = false;
  std::vector<std::uint8_t> mask_;   // the last forward's mask, drawn on the host (1 = kept)
  DeviceBuffer<std::uint8_t> keep_;  // its device copy
};

}  // namespace

std::unique_ptr<Layer> make_relu_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                      const LayerPlacement& placement) {
  return std::make_unique<CudaReLU>(backend, std::move(host), placement);
}

std::unique_ptr<Layer> make_flatten_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                         const LayerPlacement& placement) {
  return std::make_unique<CudaFlatten>(backend, std::move(host), placement);
}

std::unique_ptr<Layer> make_add_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                     const LayerPlacement& placement) {
  return std::make_unique<CudaAdd>(backend, std::move(host), placement);
}

std::unique_ptr<Layer> make_maxpool2d_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                           const LayerPlacement& placement) {
  return std::make_unique<CudaMaxPool2d>(backend, std::move(host), placement);
}

std::unique_ptr<Layer> make_global_avgpool_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                                const LayerPlacement& placement) {
  return std::make_unique<CudaGlobalAvgPool>(backend, std::move(host), placement);
}

std::unique_ptr<Layer> make_dropout_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                         const LayerPlacement& placement) {
  return std::make_unique<CudaDropout>(backend, std::move(host), placement);
}

}  // namespace gradscale::cuda
