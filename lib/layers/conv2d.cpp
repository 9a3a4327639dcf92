// Conv2d (see conv2d.h). Per sample: cols = im2col(x) [C·k·k, Ho·Wo], y = W·cols; backward
// dW += g·colsᵀ, gx = col2im(Wᵀ·g), or the sparse path for a mostly-zero g. The batch is split
// statically over OpenMP threads; Eigen sees it is inside a parallel region and runs each GEMM
// single-threaded.
#include "lib/layers/conv2d.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "lib/layers/precision_ops.h"

namespace gradscale {

namespace {

using RowMap = Eigen::Map<RowMatrix>;  // unaligned: per-sample slices start anywhere
using ConstRowMap = Eigen::Map<const RowMatrix>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;

// Range [lo, hi) of output columns whose input column o·stride − pad + offset lies in [0, size).
void valid_range(std::int64_t size, std::int64_t out, std::int64_t stride, std::int64_t pad,
                 std::int64_t offset, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t first = pad - offset;            // o·stride ≥ first
  const std::int64_t last = size - 1 + pad - offset;  // o·stride ≤ last
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, out);
  hi = std::max(lo, std::min(hi, out));
}

}  // namespace

Conv2d::Conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
               std::int64_t stride, std::int64_t padding, bool bias, const InitSpec& init, Rng& rng)
    : ParametricLayer(std::move(name), bias),
      in_ch_(in_channels),
      out_ch_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(padding) {
  check_sizes();
  allocate_parameters(init, rng);
}

Conv2d::Conv2d(std::string name, const Options& o)
    : ParametricLayer(std::move(name), o.bias_, o.init_, "Conv2d::Options"),
      in_ch_(o.in_channels_),
      out_ch_(o.out_channels_),
      kernel_(o.kernel_),
      stride_(o.stride_),
      pad_(o.padding_) {
  GS_CHECK_CONFIG(in_ch_ >= 0, "layer '" << name_ << "': in_channels must be > 0 (got " << in_ch_
                                         << "; leave it out to take the input's)");
  GS_CHECK_CONFIG(out_ch_ > 0, "layer '" << name_ << "': Conv2d::Options needs out_channels > 0 (got "
                                         << out_ch_ << ")");
  GS_CHECK_CONFIG(kernel_ > 0, "layer '" << name_ << "': Conv2d::Options needs kernel > 0 (got " << kernel_ << ")");
  GS_CHECK_CONFIG(stride_ > 0, "layer '" << name_ << "': stride must be > 0 (got " << stride_ << ")");
  GS_CHECK_CONFIG(pad_ >= 0, "layer '" << name_ << "': padding must be >= 0 (got " << pad_ << ")");
}

void Conv2d::check_sizes() const {
  GS_CHECK_CONFIG(in_ch_ > 0 && out_ch_ > 0,
                  "layer '" << name_ << "': in_channels and out_channels must be > 0 (got " << in_ch_
                            << ", " << out_ch_ << ")");
  GS_CHECK_CONFIG(kernel_ > 0, "layer '" << name_ << "': kernel must be > 0 (got " << kernel_ << ")");
  GS_CHECK_CONFIG(stride_ > 0, "layer '" << name_ << "': stride must be > 0 (got " << stride_ << ")");
  GS_CHECK_CONFIG(pad_ >= 0, "layer '" << name_ << "': padding must be >= 0 (got " << pad_ << ")");
}

void Conv2d::allocate_parameters(const InitSpec& init, Rng& rng) {
  allocate_weight_and_bias({out_ch_, in_ch_, kernel_, kernel_}, out_ch_, in_ch_ * kernel_ * kernel_,
                           out_ch_ * kernel_ * kernel_, init, rng);
}

void Conv2d::infer_input_size(const std::vector<Shape>& inputs) {
  GS_CHECK_SHAPE(inputs.size() == 1 && inputs[0].size() == 4,
                 "layer '" << name_ << "' (conv2d) expects input [N, C, H, W], got "
                           << (inputs.empty() ? std::string("none") : shape_string(inputs[0])));
  if (in_ch_ == 0) in_ch_ = inputs[0][1];  // a mismatch with a given in_channels: output_shape says so
}

Shape Conv2d::output_shape(const std::vector<Shape>& inputs) const {
  GS_CHECK_SHAPE(inputs.size() == 1, "layer '" << name_ << "' takes one input");
  const Shape& s = inputs[0];
  GS_CHECK_SHAPE(s.size() == 4 && s[1] == in_ch_, "layer '" << name_ << "' (conv2d " << in_ch_ << "->"
                                                            << out_ch_ << ") expects input [N, " << in_ch_
                                                            << ", H, W], got " << shape_string(s));
  const std::int64_t ho = (s[2] + 2 * pad_ - kernel_) / stride_ + 1;
  const std::int64_t wo = (s[3] + 2 * pad_ - kernel_) / stride_ + 1;
  GS_CHECK_SHAPE(s[2] + 2 * pad_ >= kernel_ && s[3] + 2 * pad_ >= kernel_,
                 "layer '" << name_ << "': input " << shape_string(s) << " is smaller than the " << kernel_
                           << "x" << kernel_ << " kernel with padding " << pad_);
  return {s[0], out_ch_, ho, wo};
}

Conv2d::Geometry Conv2d::geometry(const Tensor& x) const {
  const Shape out = output_shape({x.shape()});
  return {x.dim(0), x.dim(2), x.dim(3), out[2], out[3]};
}

void Conv2d::im2col(const float* x, const Geometry& g, float* cols) const {
  const std::int64_t plane = g.ho * g.wo;
  for (std::int64_t c = 0; c < in_ch_; ++c) {
    for (std::int64_t ki = 0; ki < kernel_; ++ki) {
      for (std::int64_t kj = 0; kj < kernel_; ++kj) {
        float* row = cols + ((c * kernel_ + ki) * kernel_ + kj) * plane;
        std::int64_t lo = 0, hi = 0;
        valid_range(g.w, g.wo, stride_, pad_, kj, lo, hi);
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          float* out = row + oh * g.wo;
          const std::int64_t ih = oh * stride_ - pad_ + ki;
          if (ih < 0 || ih >= g.h) {
            std::fill(out, out + g.wo, 0.0f);
            continue;
          }
          const float* in = x + (c * g.h + ih) * g.w - pad_ + kj;  // in[ow·stride] is column ow
          std::fill(out, out + lo, 0.0f);
          if (stride_ == 1) {
            std::copy(in + lo, in + hi, out + lo);
          } else {
            for (std::int64_t ow = lo; ow < hi; ++ow) out[ow] = in[ow * stride_];
          }
          std::fill(out + hi, out + g.wo, 0.0f);
        }
      }
    }
  }
}

void Conv2d::col2im(const float* cols, const Geometry& g, float* gx) const {
  const std::int64_t plane = g.ho * g.wo;
  std::fill(gx, gx + in_ch_ * g.h * g.w, 0.0f);
  for (std::int64_t c = 0; c < in_ch_; ++c) {
    for (std::int64_t ki = 0; ki < kernel_; ++ki) {
      for (std::int64_t kj = 0; kj < kernel_; ++kj) {
        const float* row = cols + ((c * kernel_ + ki) * kernel_ + kj) * plane;
        std::int64_t lo = 0, hi = 0;
        valid_range(g.w, g.wo, stride_, pad_, kj, lo, hi);
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          const std::int64_t ih = oh * stride_ - pad_ + ki;
          if (ih < 0 || ih >= g.h) continue;
          const float* src = row + oh * g.wo;
          float* dst = gx + (c * g.h + ih) * g.w - pad_ + kj;
          if (stride_ == 1) {
            for (std::int64_t ow = lo; ow < hi; ++ow) dst[ow] += src[ow];
          } else {
            for (std::int64_t ow = lo; ow < hi; ++ow) dst[ow * stride_] += src[ow];
          }
        }
      }
    }
  }
}

void Conv2d::sparse_backward_sample(const float* x, const float* g, const Geometry& geo, const float* wp,
                                    float* xpad, float* gxpad, float* grad_wp, float* gx) const {
  const std::int64_t c_in = in_ch_, hp = geo.h + 2 * pad_, wp_cols = geo.w + 2 * pad_;
  const std::int64_t row = kernel_ * c_in, plane = geo.ho * geo.wo, pad_size = hp * wp_cols * c_in;
  // Channels-last copy of x with a zero border: patch (oh, ow), kernel row ki, is the k·C floats from
  // xpad[oh·stride + ki][ow·stride][0], in the [kj][c] order of the [O, k, k, C] weight layout.
  std::fill(xpad, xpad + pad_size, 0.0f);
  for (std::int64_t c = 0; c < c_in; ++c)
    for (std::int64_t ih = 0; ih < geo.h; ++ih) {
      const float* src = x + (c * geo.h + ih) * geo.w;
      float* dst = xpad + ((ih + pad_) * wp_cols + pad_) * c_in + c;
      for (std::int64_t iw = 0; iw < geo.w; ++iw) dst[iw * c_in] = src[iw];
    }
  if (gx) std::fill(gxpad, gxpad + pad_size, 0.0f);

  for (std::int64_t o = 0; o < out_ch_; ++o) {
    const float* go = g + o * plane;
    float* dwo = grad_wp + o * kernel_ * row;
    const float* wo = wp + o * kernel_ * row;
    for (std::int64_t p = 0; p < plane; ++p) {
      const float v = go[p];
      if (v == 0.0f) continue;
      const std::int64_t at = ((p / geo.wo) * stride_ * wp_cols + (p % geo.wo) * stride_) * c_in;
      for (std::int64_t ki = 0; ki < kernel_; ++ki) {
        const std::int64_t off = at + ki * wp_cols * c_in;
        const float* __restrict xr = xpad + off;
        float* __restrict dwr = dwo + ki * row;
        for (std::int64_t t = 0; t < row; ++t) dwr[t] += v * xr[t];
        if (!gx) continue;
        const float* __restrict wr = wo + ki * row;
        float* __restrict gr = gxpad + off;
        for (std::int64_t t = 0; t < row; ++t) gr[t] += v * wr[t];
      }
    }
  }

  if (!gx) return;
  for (std::int64_t c = 0; c < c_in; ++c)
    for (std::int64_t ih = 0; ih < geo.h; ++ih) {
      const float* src = gxpad + ((ih + pad_) * wp_cols + pad_) * c_in + c;
      float* dst = gx + (c * geo.h + ih) * geo.w;
      for (std::int64_t iw = 0; iw < geo.w; ++iw) dst[iw] = src[iw * c_in];
    }
}

void Conv2d::ensure_thread_buffers(int threads, std::int64_t col_size, std::int64_t pad_size) {
  const auto t = static_cast<std::size_t>(threads);
  if (thread_cols_.size() < t) {
    thread_cols_.resize(t);
    thread_grad_w_.resize(t);
    thread_grad_b_.resize(t);
    thread_xpad_.resize(t);
    thread_gxpad_.resize(t);
    thread_grad_wp_.resize(t);
  }
  for (std::size_t i = 0; i < t; ++i) {
    thread_cols_[i].resize({col_size});
    thread_grad_w_[i].resize(weight_.value.shape());
    thread_grad_b_[i].resize({out_ch_});
    if (pad_size == 0) continue;
    thread_xpad_[i].resize({pad_size});
    thread_gxpad_[i].resize({pad_size});
    thread_grad_wp_[i].resize({weight_.value.size()});
  }
}

void Conv2d::forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) {
  const Tensor& x = *inputs[0];
  const Geometry geo = geometry(x);
  GS_CHECK(weight_work_.size() == weight_.value.size(),
           "layer '" << name_ << "': prepare_weights() was not called");
  output.resize({geo.n, out_ch_, geo.ho, geo.wo});
  const std::int64_t ckk = in_ch_ * kernel_ * kernel_, plane = geo.ho * geo.wo;
  const std::int64_t in_size = in_ch_ * geo.h * geo.w, out_size = out_ch_ * plane;
  ensure_thread_buffers(omp_get_max_threads(), ckk * plane);

  const ConstRowMap w(weight_work_.data(), out_ch_, ckk);
  const float* xd = x.data();
  float* yd = output.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < geo.n; ++i) {
    float* cols = thread_cols_[static_cast<std::size_t>(omp_get_thread_num())].data();
    im2col(xd + i * in_size, geo, cols);
    RowMap y(yd + i * out_size, out_ch_, plane);
    y.noalias() = w * ConstRowMap(cols, ckk, plane);
    if (has_bias_) y.colwise() += ConstVecMap(bias_work_.data(), out_ch_);
  }
  round_output(output, ctx.precision);
}

void Conv2d::backward(const std::vector<const Tensor*>& inputs, const Tensor& /*output*/,
                      const ScaledGrad& grad_output, const std::vector<ScaledGrad*>& grad_inputs,
                      BackwardContext& ctx) {
  const Tensor& x = *inputs[0];
  const Geometry geo = geometry(x);
  GS_CHECK_SHAPE(grad_output.g.shape() == Shape({geo.n, out_ch_, geo.ho, geo.wo}),
                 "layer '" << name_ << "': output gradient " << shape_string(grad_output.g.shape())
                           << " does not match the output of input " << shape_string(x.shape()));
  const std::int64_t ckk = in_ch_ * kernel_ * kernel_, plane = geo.ho * geo.wo;
  const std::int64_t in_size = in_ch_ * geo.h * geo.w, out_size = out_ch_ * plane;
  const double scale = grad_output.scale;

  ScaledGrad* gx = grad_inputs[0];
  if (gx) gx->g.resize(x.shape());
  const int threads = omp_get_max_threads();
  const bool sparse_allowed = sparse_density_ > 0 && kernel_ * in_ch_ >= kSparseMinRow;
  const std::int64_t pad_size = sparse_allowed ? (geo.h + 2 * pad_) * (geo.w + 2 * pad_) * in_ch_ : 0;
  ensure_thread_buffers(threads, ckk * plane, pad_size);
  for (int t = 0; t < threads; ++t) {
    thread_grad_w_[static_cast<std::size_t>(t)].fill(0.0f);
    thread_grad_b_[static_cast<std::size_t>(t)].fill(0.0f);
    if (sparse_allowed) thread_grad_wp_[static_cast<std::size_t>(t)].fill(0.0f);
  }
  if (sparse_allowed && gx) {  // working weights as [O, k, k, C] for the sparse input gradient
    weight_work_hwc_.resize({weight_.value.size()});
    const float* w = weight_work_.data();
    float* wp = weight_work_hwc_.data();
    const std::int64_t kk = kernel_ * kernel_;
    for (std::int64_t o = 0; o < out_ch_; ++o)
      for (std::int64_t c = 0; c < in_ch_; ++c)
        for (std::int64_t q = 0; q < kk; ++q) wp[(o * kk + q) * in_ch_ + c] = w[(o * in_ch_ + c) * kk + q];
  }
  const auto max_nonzero = static_cast<std::int64_t>(sparse_density_ * static_cast<double>(out_size));

  // One pass over the batch: weight-gradient partial sums at scale S, and the fp32 upstream gradient
  // o = col2im(Wᵀ·g) at scale S (SPEC §5 steps 2–3, before the local scale).
  const ConstRowMap w(weight_work_.data(), out_ch_, ckk);
  const float* xd = x.data();
  const float* gd = grad_output.g.data();
  float* gxd = gx ? gx->g.data() : nullptr;
  bool any_sparse = false;
#pragma omp parallel for schedule(static) reduction(|| : any_sparse)
  for (std::int64_t i = 0; i < geo.n; ++i) {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const ConstRowMap gi(gd + i * out_size, out_ch_, plane);
    if (has_bias_) VecMap(thread_grad_b_[t].data(), out_ch_) += gi.rowwise().sum();
    if (sparse_allowed) {
      std::int64_t nonzero = 0;
      for (std::int64_t j = 0; j < out_size; ++j) nonzero += gd[i * out_size + j] != 0.0f;
      if (nonzero <= max_nonzero) {
        sparse_backward_sample(xd + i * in_size, gd + i * out_size, geo, weight_work_hwc_.data(),
                               thread_xpad_[t].data(), thread_gxpad_[t].data(), thread_grad_wp_[t].data(),
                               gxd ? gxd + i * in_size : nullptr);
        any_sparse = true;
        continue;
      }
    }
    float* cols = thread_cols_[t].data();
    im2col(xd + i * in_size, geo, cols);
    RowMap(thread_grad_w_[t].data(), out_ch_, ckk).noalias() +=
        gi * ConstRowMap(cols, ckk, plane).transpose();
    if (gxd) {
      RowMap(cols, ckk, plane).noalias() = w.transpose() * gi;  // reuses the buffer: cols are done
      col2im(cols, geo, gxd + i * in_size);
    }
  }

  // Upstream gradient (steps 1–2): s from the controller, round(s·o) once, carried at s·S.
  if (gx) {
    const ConvGeometry cg{geo.n, in_ch_, out_ch_, kernel_, stride_, pad_, geo.h, geo.w, geo.ho, geo.wo};
    const UpstreamProduct product{weight_work_, reduction_length(),
                                  [&] { return conv_product_range(gd, weight_work_.data(), cg); }};
    scale_upstream_grad(*this, grad_output, product, *gx, ctx);
  }

  // Weight gradients at scale S (step 3): partial sums combined in thread order.
  grad_w_.resize(weight_.value.shape());
  std::memcpy(grad_w_.data(), thread_grad_w_[0].data(),
              static_cast<std::size_t>(grad_w_.size()) * sizeof(float));
  for (int t = 1; t < threads; ++t)
    grad_w_.rows_view() += thread_grad_w_[static_cast<std::size_t>(t)].rows_view();
  if (any_sparse) {  // the sparse partial sums, [O, k, k, C] -> [O, C, k, k], in thread order
    const std::int64_t kk = kernel_ * kernel_;
    float* gw = grad_w_.data();
    for (int t = 0; t < threads; ++t) {
      const float* wp = thread_grad_wp_[static_cast<std::size_t>(t)].data();
      for (std::int64_t o = 0; o < out_ch_; ++o)
        for (std::int64_t c = 0; c < in_ch_; ++c)
          for (std::int64_t q = 0; q < kk; ++q)
            gw[(o * in_ch_ + c) * kk + q] += wp[(o * kk + q) * in_ch_ + c];
    }
  }
  if (has_bias_) {
    grad_b_.resize(bias_.value.shape());
    std::memcpy(grad_b_.data(), thread_grad_b_[0].data(), static_cast<std::size_t>(out_ch_) * sizeof(float));
    for (int t = 1; t < threads; ++t)
      VecMap(grad_b_.data(), out_ch_) += VecMap(thread_grad_b_[static_cast<std::size_t>(t)].data(), out_ch_);
  }
  accumulate_parameter_grads(scale, ctx);
}

nlohmann::json Conv2d::describe() const {
  return {{"name", name_},           {"kind", kind()},    {"in_channels", in_ch_},
          {"out_channels", out_ch_}, {"kernel", kernel_}, {"stride", stride_},
          {"padding", pad_},         {"bias", has_bias_}, {"weight_shape", weight_.value.shape()},
          {"K", reduction_length()}};
}

}  // namespace gradscale
