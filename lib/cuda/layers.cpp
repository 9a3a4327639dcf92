// The CUDA backend's layers (see layers.h).
#include "lib/cuda/layers.h"

#include <algorithm>
#include <iterator>

#include "lib/core/random.h"
#include "lib/cuda/avgpool.h"
#include "lib/cuda/backend.h"
#include "lib/cuda/batchnorm.h"
#include "lib/cuda/dropout.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/maxpool.h"
#include "lib/cuda/permute.h"
#include "lib/cuda/relu.h"

namespace gradscale::cuda {
namespace {

// A layer whose backward keeps the scale (SPEC §5: ReLU, pooling, flatten, the join's fork, BatchNorm):
// the host value and the device's entry alike.
void pass_scale(ScaledGrad& gx, const ScaledGrad& from) {
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
    backend_.round_working_copy(*params_[0], weight_work_, p);
    if (has_bias_) backend_.round_working_copy(*params_[1], bias_work_, p);
    // The weight's 16-bit copy for the step's GEMMs (its values are in F), made once here rather than
    // at each of the two GEMMs that read it.
    weight16_type_ = backend_.gemm_type(p.format, p.format, true);
    if (weight16_type_ != DeviceType::f32) {
      const auto n = static_cast<std::size_t>(weight_work_.size());
      if (weight16_.size() < n) weight16_.resize(n);
      backend_.to_16bit(weight_work_.data(), n, weight16_type_, weight16_.data());
    }
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
    backend_.accumulate_weight_grad(grad_w_, grad_output, *params_[0], id_, ctx.precision, ctx.monitor);
    if (has_bias_)
      backend_.accumulate_weight_grad(grad_b_, grad_output, *params_[1], id_, ctx.precision, ctx.monitor);
  }

  bool has_bias_ = false;
  Tensor weight_work_, bias_work_;  // working copies in F
  DeviceType weight16_type_ = DeviceType::f32;
  DeviceBuffer<std::uint16_t> weight16_;  // weight_work_ as weight16_type_, when that is 16-bit
  Tensor grad_w_, grad_b_, ones_;
};

// y = x·Wᵀ + b with cuBLAS (operands holding values in F, read as 16-bit copies where the placement
// guarantees them, fp32 accumulation); backward as lib/layers/linear.cpp: o = g·W in fp32 then the
// controller's s and one rounding, dW = gᵀ·x, db = Σ g.
class CudaLinear final : public ParametricLayer {
 public:
  CudaLinear(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : ParametricLayer(backend, std::move(host), placement) {
    const nlohmann::json d = host_->describe();
    in_ = d.at("in").get<std::int64_t>();
    out_ = d.at("out").get<std::int64_t>();
  }

  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    const std::int64_t n = x.dim(0);
    output.resize(output_shape({x.shape()}));
    CudaContext& c = backend_.context();
    const Format f = ctx.precision.format;
    const DeviceType t = backend_.gemm_type(f, f, placement_.inputs_in_format);
    gemm(c, n, out_, in_, 1.0f, operand(x, t, 0), weight_operand(t, 1, true), 0.0f, {output.data()});
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
    const Format f = ctx.precision.format, gf = ctx.precision.gradient_format();
    // g·W reads g and W; gᵀ·x reads g and x (the model input is not in F: then fp32).
    const DeviceType tg = backend_.gemm_type(gf, f, placement_.output_grad_in_format);
    const DeviceType tw = backend_.gemm_type(gf, f, placement_.output_grad_in_format && placement_.inputs_in_format);
    const void* g_converted = nullptr;  // g in slot 0 as tg, when the upstream GEMM converted it
    if (ScaledGrad* gx = grad_inputs[0]) {
      gx->g.resize(x.shape());
      const GemmInput g_in = operand(g, tg, 0);
      g_converted = g_in.data;
      gemm(c, n, in_, out_, 1.0f, g_in, weight_operand(tg, 1), 0.0f, {gx->g.data()});
      const std::int64_t out = out_, in = in_;
      const UpstreamProduct product{weight_work_, out_, [&g, this, n, out, in] {
                                      const Tensor hg = g.to_host(), hw = weight_work_.to_host();
                                      return dense_product_range(hg.data(), n, out, hw.data(), in);
                                    }};
      backend_.scale_upstream_grad(*this, grad_output, product, *gx, ctx);
    }
    grad_w_.resize(params_[0]->value.shape());
    const GemmInput g_t = g_converted && tg == tw ? GemmInput{g_converted, tw, true} : operand(g, tw, 0, true);
    gemm(c, out_, in_, n, 1.0f, g_t, operand(x, tw, 1), 0.0f, {grad_w_.data()});
    if (has_bias_) {
      ensure_ones(n);
      grad_b_.resize(params_[1]->value.shape());
      gemm(c, 1, out_, n, 1.0f, {ones_.data()}, {g.data()}, 0.0f, {grad_b_.data()});
    }
    accumulate_parameter_grads(grad_output, ctx);
  }

 private:
  std::int64_t in_ = 0, out_ = 0;
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
    GS_CHECK_SHAPE(inputs.size() == 2, "layer '" << name_ << "' (add) takes two inputs, got " << inputs.size());
    output.resize(output_shape({inputs[0]->shape(), inputs[1]->shape()}));
    add(inputs[0]->data(), inputs[1]->data(), output.data(), static_cast<std::size_t>(output.size()),
        backend_.context().stream());
    backend_.round_output(output, ctx.precision);
  }
  void backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext&) override {
    GS_CHECK_SHAPE(grad_inputs.size() == 2, "layer '" << name_ << "' (add): " << grad_inputs.size()
                                                         << " input gradients, not 2");
    check_output_grad(*this, grad_output.g, output);
    for (ScaledGrad* gx : grad_inputs) {
      if (!gx) continue;
      gx->g.copy_from(grad_output.g);
      pass_scale(*gx, grad_output);
    }
  }
};

// Convolution as im2col + cuBLAS (lib/layers/conv2d.cpp's steps, SPEC §4–§5). Forward: the columns of
// each sample, y_b = W·cols_b as one batched GEMM (and + b as a batched rank-1 GEMM: one exact product,
// then the CPU's one fp32 sum), rounded to F. Backward: the output gradient as [O, n·Ho·Wo] and the
// columns of the whole batch side by side, so dW = g·colsᵀ and the upstream Wᵀ·g are one GEMM each
// (K = n·Ho·Wo and O); col2im in the CPU's order, then the controller's s and one rounding; the weight
// and bias gradients are rounded and unscaled as Linear's. The columns are recomputed in backward, as
// on the CPU, rather than kept from forward (C·k²·n·Ho·Wo floats per layer).
class CudaConv2d final : public ParametricLayer {
 public:
  CudaConv2d(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : ParametricLayer(backend, std::move(host), placement), cols_(device_tensor()), g_wide_(device_tensor()) {
    const nlohmann::json d = host_->describe();
    in_ = d.at("in_channels").get<std::int64_t>();
    out_ = d.at("out_channels").get<std::int64_t>();
    kernel_ = d.at("kernel").get<std::int64_t>();
    stride_ = d.at("stride").get<std::int64_t>();
    pad_ = d.at("padding").get<std::int64_t>();
  }

  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    output.resize(output_shape({x.shape()}));  // checks the input's shape
    GS_CHECK(weight_work_.size() == params_[0]->value.size(),
             "layer '" << name_ << "': prepare_weights() was not called");
    const ConvGeometry geo = geometry(x);
    const std::int64_t n = geo.n, rows = geo.col_rows(), plane = geo.col_cols();
    CudaContext& c = backend_.context();
    cols_.resize({n * rows * plane});
    im2col(x.data(), geo, cols_.data(), c.stream());
    const Format f = ctx.precision.format;
    const DeviceType t = backend_.gemm_type(f, f, placement_.inputs_in_format);  // the columns are x's values
    gemm(c, out_, plane, rows, 1.0f, weight_operand(t, 0), operand(cols_, t, 1, false, rows * plane), 0.0f,
         {output.data(), DeviceType::f32, out_ * plane}, n);
    if (has_bias_) {
      ensure_ones(plane);
      gemm(c, out_, plane, 1, 1.0f, {bias_work_.data()}, {ones_.data()}, 1.0f,
           {output.data(), DeviceType::f32, out_ * plane}, n);
    }
    backend_.round_output(output, ctx.precision);
  }

  void backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    const Tensor& x = *inputs[0];
    const ConvGeometry geo = geometry(x);
    const std::int64_t n = geo.n, rows = geo.col_rows(), plane = geo.col_cols(), wide = n * plane;
    const Tensor& g = grad_output.g;
    GS_CHECK_SHAPE(g.shape() == Shape({n, out_, geo.ho(), geo.wo()}),
                   "layer '" << name_ << "': output gradient " << shape_string(g.shape())
                             << " does not match the output of input " << shape_string(x.shape()));
    CudaContext& c = backend_.context();
    g_wide_.resize({out_, wide});
    swap_outer(g.data(), n, out_, plane, g_wide_.data(), c.stream());
    cols_.resize({rows, wide});
    im2col(x.data(), geo, cols_.data(), c.stream(), ColumnLayout::batch_wide);
    // dW = g·colsᵀ at scale S, one GEMM over the batch; then the columns' buffer takes Wᵀ·g.
    const Format f = ctx.precision.format, gf = ctx.precision.gradient_format();
    const DeviceType tg = backend_.gemm_type(gf, f, placement_.output_grad_in_format);
    const DeviceType tw = backend_.gemm_type(gf, f, placement_.output_grad_in_format && placement_.inputs_in_format);
    grad_w_.resize(params_[0]->value.shape());
    const GemmInput g_w = operand(g_wide_, tw, 0);
    gemm(c, out_, rows, wide, 1.0f, g_w, operand(cols_, tw, 1, true), 0.0f, {grad_w_.data()});
    if (has_bias_) {
      ensure_ones(wide);
      grad_b_.resize(params_[1]->value.shape());
      gemm(c, out_, 1, wide, 1.0f, {g_wide_.data()}, {ones_.data()}, 0.0f, {grad_b_.data()});
    }
    if (ScaledGrad* gx = grad_inputs[0]) {  // SPEC §5 steps 1–2: o = col2im(Wᵀ·g) in fp32, then s
      gx->g.resize(x.shape());
      const GemmInput g_x = tg == tw ? g_w : operand(g_wide_, tg, 0);  // slot 0 still holds g when tg == tw
      gemm(c, rows, wide, out_, 1.0f, weight_operand(tg, 1, true), g_x, 0.0f, {cols_.data()});
      col2im(cols_.data(), geo, gx->g.data(), c.stream(), ColumnLayout::batch_wide);
      const gradscale::ConvGeometry cg{n, in_, out_, kernel_, stride_, pad_, geo.h, geo.w, geo.ho(), geo.wo()};
      const UpstreamProduct product{weight_work_, reduction_length(), [&g, this, cg] {
                                      const Tensor hg = g.to_host(), hw = weight_work_.to_host();
                                      return conv_product_range(hg.data(), hw.data(), cg);
                                    }};
      backend_.scale_upstream_grad(*this, grad_output, product, *gx, ctx);
    }
    accumulate_parameter_grads(grad_output, ctx);
  }

 private:
  ConvGeometry geometry(const Tensor& x) const { return {x.dim(0), in_, x.dim(2), x.dim(3), kernel_, stride_, pad_}; }

  std::int64_t in_ = 0, out_ = 0, kernel_ = 1, stride_ = 1, pad_ = 0;
  Tensor cols_;    // forward: [n, C·k², Ho·Wo]; backward: [C·k², n·Ho·Wo], then Wᵀ·g in the same layout
  Tensor g_wide_;  // the output gradient as [O, n·Ho·Wo]
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
    GS_CHECK_SHAPE(grad_output.g.shape() == output.shape() && argmax_.size() == static_cast<std::size_t>(output.size()),
                   "layer '" << name_ << "': output gradient " << shape_string(grad_output.g.shape())
                             << " does not match the last forward's output " << shape_string(output.shape()));
    gx->g.resize(x.shape());
    max_pool_backward(grad_output.g.data(), argmax_.data(), geometry(x), gx->g.data(), backend_.context().stream());
    if (stride_ < kernel_) backend_.round_activation_grad(gx->g, id_, ctx.precision, ctx.monitor);
    pass_scale(*gx, grad_output);
  }

 private:
  PoolGeometry geometry(const Tensor& x) const { return {x.dim(0) * x.dim(1), x.dim(2), x.dim(3), kernel_, stride_}; }
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
    global_avg_pool_forward(x.data(), output.size(), x.dim(2) * x.dim(3), output.data(), backend_.context().stream());
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
    GS_CHECK(buffers_.size() == 2, "layer '" << name_ << "': batchnorm has running mean and variance buffers");
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
      GS_CHECK_SHAPE(s.n * s.plane > 1, "layer '" << name_
                                                  << "': training needs more than one value per channel, got input "
                                                  << shape_string(x.shape()));
      batchnorm_forward_training(x.data(), s, gamma_work_.data(), beta_work_.data(), eps_, momentum_, running_mean,
                                 running_var, mean_.data(), invstd_.data(), output.data(), stream);
    } else {
      batchnorm_forward_eval(x.data(), s, gamma_work_.data(), beta_work_.data(), running_mean, running_var, eps_,
                             mean_.data(), invstd_.data(), output.data(), stream);
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
                       mean_.data(), invstd_.data(), last_training_, gx ? gx->g.data() : nullptr, grad_gamma_.data(),
                       grad_beta_.data());
    if (gx) {
      backend_.round_activation_grad(gx->g, id_, ctx.precision, ctx.monitor);
      pass_scale(*gx, grad_output);
    }
    backend_.accumulate_weight_grad(grad_gamma_, grad_output, *params_[0], id_, ctx.precision, ctx.monitor);
    backend_.accumulate_weight_grad(grad_beta_, grad_output, *params_[1], id_, ctx.precision, ctx.monitor);
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
    GS_CUDA_CHECK(cudaMemcpyAsync(keep_.data(), mask_.data(), n * sizeof(std::uint8_t), cudaMemcpyHostToDevice,
                                  backend_.context().stream()));
    apply_dropout_mask(x.data(), keep_.data(), factor_, output.data(), n, backend_.context().stream());
    backend_.round_output(output, ctx.precision);
  }
  void backward(const std::vector<const Tensor*>& inputs, const Tensor&, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override {
    ScaledGrad* gx = grad_inputs[0];
    if (!gx) return;
    const Tensor& x = *inputs[0];
    GS_CHECK_SHAPE(grad_output.g.shape() == x.shape() &&
                       (!masked_ || keep_.size() == static_cast<std::size_t>(x.size())),
                   "layer '" << name_ << "': output gradient " << shape_string(grad_output.g.shape())
                             << " does not match input " << shape_string(x.shape()));
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
  std::vector<std::uint8_t> mask_;     // the last forward's mask, drawn on the host (1 = kept)
  DeviceBuffer<std::uint8_t> keep_;    // its device copy
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

bool runs_on_gpu(const std::string& kind) {
  static const char* const kinds[] = {"linear",         "relu",      "flatten",  "add",    "conv2d",
                                      "maxpool2d",      "global_avgpool", "batchnorm", "dropout"};
  return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

std::unique_ptr<Layer> adopt_layer(CudaBackend& backend, std::unique_ptr<Layer> layer,
                                   const LayerPlacement& placement) {
  const std::string kind = layer->kind();
  if (kind == "linear") return std::make_unique<CudaLinear>(backend, std::move(layer), placement);
  if (kind == "relu") return std::make_unique<CudaReLU>(backend, std::move(layer), placement);
  if (kind == "flatten") return std::make_unique<CudaFlatten>(backend, std::move(layer), placement);
  if (kind == "add") return std::make_unique<CudaAdd>(backend, std::move(layer), placement);
  if (kind == "conv2d") return std::make_unique<CudaConv2d>(backend, std::move(layer), placement);
  if (kind == "maxpool2d") return std::make_unique<CudaMaxPool2d>(backend, std::move(layer), placement);
  if (kind == "global_avgpool") return std::make_unique<CudaGlobalAvgPool>(backend, std::move(layer), placement);
  if (kind == "batchnorm") return std::make_unique<CudaBatchNorm>(backend, std::move(layer), placement);
  if (kind == "dropout") return std::make_unique<CudaDropout>(backend, std::move(layer), placement);
  return std::make_unique<HostLayer>(backend, std::move(layer));
}

}  // namespace gradscale::cuda
