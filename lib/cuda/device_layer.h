// What the CUDA backend's layer twins (lib/cuda/layers.h) share: DeviceLayer keeps the host layer for
// its description and device copies of its parameters; ParametricLayer adds the working weights, their
// 16-bit GEMM copy and the weight gradients of Linear and Conv2d. One factory per twin, each in the file
// of its layer (layer_linear.cpp, layer_conv2d.cpp, layer_batchnorm.cpp, scale_passing_layers.cpp,
// host_layer.cpp); adopt_layer (layers.cpp) picks one by kind.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/cuda/backend.h"
#include "lib/cuda/device_buffer.h"
#include "lib/cuda/gemm.h"
#include "lib/layers/layer.h"

namespace gradscale::cuda {

// A layer whose backward keeps the scale (SPEC §5: ReLU, pooling, flatten, the join's fork, BatchNorm):
// the host value and the device's entry alike.
inline void pass_scale(ScaledGrad& gx, const ScaledGrad& from) {
  gx.scale = from.scale;
  gx.device_scale = from.device_scale;
}

// What every twin shares: the host layer for its description, and device copies of its parameters.
class DeviceLayer : public Layer {
 public:
  DeviceLayer(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : Layer(host->name()), backend_(backend), host_(std::move(host)), placement_(placement) {
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
  bool output_in_format(bool in) const override { return host_->output_in_format(in); }
  bool input_grads_in_format(bool out) const override { return host_->input_grads_in_format(out); }

 protected:
  Tensor device_tensor() { return Tensor(backend_.memory()); }
  // A GEMM operand: t's values as `type` (CudaBackend::gemm_operand, scratch slot `slot`).
  GemmInput operand(const Tensor& t, DeviceType type, int slot, bool transposed = false,
                    std::int64_t batch_stride = 0) {
    return {backend_.gemm_operand(t.data(), static_cast<std::size_t>(t.size()), type, slot), type, transposed,
            batch_stride};
  }

  CudaBackend& backend_;
  std::unique_ptr<Layer> host_;
  LayerPlacement placement_;
  std::vector<std::unique_ptr<Parameter>> params_;
};

// What Linear and Conv2d share: working copies of the weight and the optional bias (in F, refreshed
// once per step), their fp32 gradients at scale S, and a vector of ones for the rank-1 GEMMs of the bias.
class ParametricLayer : public DeviceLayer {
 public:
  ParametricLayer(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : DeviceLayer(backend, std::move(host), placement),
        weight_work_(device_tensor()),
        bias_work_(device_tensor()),
        grad_w_(device_tensor()),
        grad_b_(device_tensor()),
        ones_(device_tensor()) {
    has_bias_ = host_->describe().at("bias").get<bool>();
  }

  void prepare_weights(const Precision& p) override {
    // The weight's 16-bit copy for the step's GEMMs (its values are in F), written by the pass that
    // rounds it, once here rather than at each of the two GEMMs that read it.
    weight16_type_ = backend_.gemm_type(p.format, p.format, true);
    std::uint16_t* half = nullptr;
    if (weight16_type_ != DeviceType::f32) {
      const auto n = static_cast<std::size_t>(params_[0]->value.size());
      if (weight16_.size() < n) weight16_.resize(n);
      half = weight16_.data();
    }
    backend_.round_working_copy(*params_[0], weight_work_, p, half, weight16_type_);
    if (has_bias_) backend_.round_working_copy(*params_[1], bias_work_, p);
  }

 protected:
  // The working weight as a GEMM operand of `type`: its 16-bit copy when that is the type, else
  // CudaBackend::gemm_operand (fp32 itself, or a conversion into scratch slot `slot`).
  GemmInput weight_operand(DeviceType type, int slot, bool transposed = false) {
    if (type != DeviceType::f32 && type == weight16_type_) return {weight16_.data(), type, transposed, 0};
    return operand(weight_work_, type, slot, transposed);
  }
  // At least n ones.
  void ensure_ones(std::int64_t n) {
    if (ones_.size() < n) ones_.reset({n}, 1.0f);
  }
  // SPEC §5 step 3 for grad_w_ (and grad_b_): rounded, unscaled by S into the master gradients.
  void accumulate_parameter_grads(const ScaledGrad& grad_output, BackwardContext& ctx) {
    if (has_bias_)
      backend_.accumulate_weight_grads(*this, {{&grad_w_, params_[0].get()}, {&grad_b_, params_[1].get()}}, grad_output, ctx);
    else
      backend_.accumulate_weight_grads(*this, {{&grad_w_, params_[0].get()}}, grad_output, ctx);
  }

  bool has_bias_ = false;
  Tensor weight_work_, bias_work_;  // working copies in F
  DeviceType weight16_type_ = DeviceType::f32;
  DeviceBuffer<std::uint16_t> weight16_;  // weight_work_ as weight16_type_, when that is 16-bit
  Tensor grad_w_, grad_b_, ones_;
};

// The twins, one factory each: `host` is the host layer of that kind, `placement` where its operands live.
std::unique_ptr<Layer> make_linear_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_conv2d_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_batchnorm_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_relu_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_flatten_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_add_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_maxpool2d_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_global_avgpool_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
std::unique_ptr<Layer> make_dropout_twin(CudaBackend&, std::unique_ptr<Layer>, const LayerPlacement&);
// A layer of a kind without a twin (a user's own Layer), run on the host inside the GPU model.
std::unique_ptr<Layer> make_host_layer(CudaBackend& backend, std::unique_ptr<Layer> host);

}  // namespace gradscale::cuda
