// The CUDA twin of Conv2d (see device_layer.h).

#include "lib/cuda/device_layer.h"

#include "lib/cuda/conv_implicit.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/permute.h"

namespace gradscale::cuda {
namespace {

// Convolution as im2col + cuBLAS (lib/layers/conv2d.cpp's steps, SPEC §4–§5). Forward: the columns of
// each sample, y_b = W·cols_b as one batched GEMM (and + b as a batched rank-1 GEMM: one exact product,
// then the CPU's one fp32 sum), rounded to F. Backward: the output gradient as [O, n·Ho·Wo] and the
// columns of the whole batch side by side, so dW = g·colsᵀ and the upstream Wᵀ·g are one GEMM each
// (K = n·Ho·Wo and O); col2im in the CPU's order (measured in the same pass when the controller decides
// on the device from the product's statistics), then the controller's s and one rounding; the weight
// and bias gradients are rounded and unscaled as Linear's. The columns are recomputed in backward, as
// on the CPU, rather than kept from forward (C·k²·n·Ho·Wo floats per layer). When a GEMM reads them in
// 16 bits, im2col writes them so, into the backend's scratch slot, in one pass (the input's values are
// in F, so the conversion is exact): no fp32 columns to write, read back and convert. With
// conv_algorithm "implicit", the forward pass (sums, bias, rounding) and the upstream product
// col2im(Wᵀ·g) are one kernel each that writes no columns (conv_implicit.h; the product's statistics are
// then a pass of their own); the weight gradient keeps its columns.
class CudaConv2d final : public ParametricLayer {
 public:
  CudaConv2d(CudaBackend& backend, std::unique_ptr<Layer> host, const LayerPlacement& placement)
      : ParametricLayer(backend, std::move(host), placement),
        cols_(device_tensor()),
        g_wide_(device_tensor()) {
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
    const Format f = ctx.precision.format;
    if (backend_.implicit_convolution()) {  // no columns: one kernel, the bias and the rounding included
      conv_forward_implicit(x.data(), geo, weight_work_.data(), out_, has_bias_ ? bias_work_.data() : nullptr,
                            output.data(), device_rounding(f, ctx.precision.round), c.stream());
      return;
    }
    const DeviceType t = backend_.gemm_type(f, f, placement_.inputs_in_format);  // the columns are x's values
    const GemmInput columns = make_columns(x, geo, t, ColumnLayout::per_sample, rows * plane);
    gemm(c, out_, plane, rows, 1.0f, weight_operand(t, 0), columns, 0.0f,
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
    // dW = g·colsᵀ at scale S, one GEMM over the batch; then the fp32 columns' buffer takes Wᵀ·g.
    const Format f = ctx.precision.format, gf = ctx.precision.gradient_format();
    const DeviceType tg = backend_.gemm_type(gf, f, placement_.output_grad_in_format);
    const DeviceType tw =
        backend_.gemm_type(gf, f, placement_.output_grad_in_format && placement_.inputs_in_format);
    GemmInput columns = make_columns(x, geo, tw, ColumnLayout::batch_wide, 0);
    columns.transposed = true;
    grad_w_.resize(params_[0]->value.shape());
    const GemmInput g_w = operand(g_wide_, tw, 0);
    gemm(c, out_, rows, wide, 1.0f, g_w, columns, 0.0f, {grad_w_.data()});
    if (has_bias_) {
      ensure_ones(wide);
      grad_b_.resize(params_[1]->value.shape());
      gemm(c, out_, 1, wide, 1.0f, {g_wide_.data()}, {ones_.data()}, 0.0f, {grad_b_.data()});
    }
    if (ScaledGrad* gx = grad_inputs[0]) {  // SPEC §5 steps 1–2: o = col2im(Wᵀ·g) in fp32, then s
      gx->g.resize(x.shape());
      const bool implicit = backend_.implicit_convolution();
      if (!implicit) {
        const GemmInput g_x = tg == tw ? g_w : operand(g_wide_, tg, 0);  // slot 0 still holds g when tg == tw
        cols_.resize({rows, wide});
        gemm(c, rows, wide, out_, 1.0f, weight_operand(tg, 1, true), g_x, 0.0f, {cols_.data()});
      }
      const gradscale::ConvGeometry cg{n,    in_,   out_,  kernel_,  stride_,
                                       pad_, geo.h, geo.w, geo.ho(), geo.wo()};
      const UpstreamProduct product{weight_work_, reduction_length(), [&g, this, cg] {
                                      const Tensor hg = g.to_host(), hw = weight_work_.to_host();
                                      return conv_product_range(hg.data(), hw.data(), cg);
                                    }};
      // col2im in the CPU's order, measured in the same pass when the controller reads the product; or
      // the implicit kernel's same sums, then their statistics (tensor_stats over gx: col2im_measured's bits).
      const auto write = [&](const StatsJob* job, DeviceStats* out, const StatsDecision* then) {
        if (implicit) {
          conv_backward_input_implicit(g.data(), geo, weight_work_.data(), out_, gx->g.data(), c.stream());
          if (job != nullptr && then != nullptr)
            tensor_stats(c, job, 1, out, *then);
          else if (job != nullptr)
            tensor_stats(c, job, 1, out);
          return;
        }
        if (job != nullptr)
          col2im_measured(c, cols_.data(), geo, ColumnLayout::batch_wide, gx->g.data(), job->format, job->round,
                          out, then);
        else
          col2im(cols_.data(), geo, gx->g.data(), c.stream(), ColumnLayout::batch_wide);
      };
      backend_.scale_upstream_grad(*this, grad_output, product, *gx, ctx, write);
    }
    accumulate_parameter_grads(grad_output, ctx);
  }

 private:
  ConvGeometry geometry(const Tensor& x) const {
    return {x.dim(0), in_, x.dim(2), x.dim(3), kernel_, stride_, pad_};
  }
  // x's columns in `layout` as a GEMM operand of `type`: fp32 in cols_, or 16-bit in scratch slot 1.
  GemmInput make_columns(const Tensor& x, const ConvGeometry& geo, DeviceType type, ColumnLayout layout,
                         std::int64_t batch_stride) {
    const std::int64_t count = geo.n * geo.col_rows() * geo.col_cols();
    cudaStream_t stream = backend_.context().stream();
    if (type == DeviceType::f32) {
      cols_.resize(layout == ColumnLayout::per_sample ? Shape{count} : Shape{geo.col_rows(), geo.n * geo.col_cols()});
      im2col(x.data(), geo, cols_.data(), stream, layout);
      return {cols_.data(), type, false, batch_stride};
    }
    std::uint16_t* cols16 = backend_.gemm_slot(1, static_cast<std::size_t>(count));
    im2col_16bit(x.data(), geo, cols16, type, stream, layout);
    return {cols16, type, false, batch_stride};
  }

  std::int64_t in_ = 0, out_ = 0, kernel_ = 1, stride_ = 1, pad_ = 0;
  Tensor cols_;  // fp32 columns (forward: [n, C·k², Ho·Wo]; backward: [C·k², n·Ho·Wo]); then Wᵀ·g
  Tensor g_wide_;  // the output gradient as [O, n·Ho·Wo]
};

}  // namespace

std::unique_ptr<Layer> make_conv2d_twin(CudaBackend& backend, std::unique_ptr<Layer> host,
                                        const LayerPlacement& placement) {
  return std::make_unique<CudaConv2d>(backend, std::move(host), placement);
}

}  // namespace gradscale::cuda
