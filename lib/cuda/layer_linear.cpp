// The CUDA twin of Linear (see device_layer.h).

#include "lib/cuda/device_layer.h"

namespace gradscale::cuda {
namespace {

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
    const DeviceType tw =
        backend_.gemm_type(gf, f, placement_.output_grad_in_format && placement_.inputs_in_format);
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
    const GemmInput g_t =
        g_converted && tg == tw ? GemmInput{g_converted, tw, true} : operand(g, tw, 0, true);
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

}  // namespace

std::unique_ptr<Layer> make_linear_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                        const LayerPlacement& placement) {
  return std::make_unique<CudaLinear>(backend, std::move(host), placement);
}

}  // namespace gradscale::cuda
