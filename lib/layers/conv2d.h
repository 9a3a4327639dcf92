// 2-d convolution as im2col + GEMM (SPEC §4–§5): the forward GEMM takes F inputs and F working weights
// and accumulates in fp32; backward computes the upstream gradient Wᵀ·g + col2im in fp32, scales it by
// the controller's local scale s before one rounding to F (carried at s·S), and rounds the weight and
// bias gradients to F before unscaling them into the fp32 master gradients — the same steps as Linear.
#pragma once

#include <vector>

#include "lib/layers/parametric_layer.h"

namespace gradscale {

class Conv2d final : public ParametricLayer {
 public:
  // Input [N, in_channels, H, W] (values in F), output [N, out_channels, Ho, Wo] (values in F) with
  // Ho = (H + 2·padding − kernel) / stride + 1 (likewise Wo). Square kernel, zero padding.
  // W: [out_channels, in_channels, kernel, kernel], initialised with fan_in = in_channels·kernel² and
  // fan_out = out_channels·kernel²; bias [out_channels] starts at 0 and has no weight decay.
  Conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
         std::int64_t stride, std::int64_t padding, bool bias, const InitSpec& init, Rng& rng);

  // The same by named options: Conv2d("conv1", Conv2d::Options{}.out_channels(16).kernel(3).padding(1)).
  // in_channels, when not given, is the input's C; the weights are drawn at Model::finalize from the
  // generator given there (Model::finalize(shape, rng)), in layer order. Required: out_channels, kernel.
  class Options {
   public:
    Options& in_channels(std::int64_t c) { return in_channels_ = c, *this; }  // default: from the input
    Options& out_channels(std::int64_t c) { return out_channels_ = c, *this; }
    Options& kernel(std::int64_t k) { return kernel_ = k, *this; }
    Options& stride(std::int64_t s) { return stride_ = s, *this; }     // default 1
    Options& padding(std::int64_t p) { return padding_ = p, *this; }   // default 0
    Options& bias(bool b) { return bias_ = b, *this; }                 // default true
    Options& init(const InitSpec& i) { return init_ = i, *this; }      // default Kaiming normal, gain √2

   private:
    friend class Conv2d;
    std::int64_t in_channels_ = 0, out_channels_ = 0, kernel_ = 0, stride_ = 1, padding_ = 0;
    bool bias_ = true;
    InitSpec init_;
  };
  Conv2d(std::string name, const Options& options);

  std::string kind() const override { return "conv2d"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  // Parallel over the batch (OpenMP, static schedule); each thread runs single-threaded Eigen GEMMs
  // on its own column buffer (allocated once, reused while the shapes stay the same).
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // Weight gradients are summed per thread over its static block of samples and the partial sums are
  // combined in thread order: for a given thread count the result is deterministic. The columns are
  // recomputed from the input, not kept from forward: measured faster on the cnn model (they stay in
  // cache) and it saves N·C·k²·Ho·Wo floats. The upstream GEMM is skipped when grad_inputs[0] is null.
  //
  // A sample whose output gradient is mostly zeros (after ReLU and max pooling at most a quarter of it
  // is non-zero) takes the sparse path instead of the two GEMMs: every non-zero g[o, p] adds g·patch(p)
  // to dW[o] and g·W[o] to the input-gradient patch of p, reading the input and writing the gradient
  // in a padded channels-last copy where a patch row is k·C contiguous floats. Same products, fewer of
  // them; only the order of the fp32 sums differs from the GEMMs.
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  nlohmann::json describe() const override;
  std::int64_t reduction_length() const override { return out_ch_ * kernel_ * kernel_; }  // K (SPEC §6.1)

  // A sample takes the sparse backward path when at most this fraction of its output gradient is
  // non-zero (and a patch row, kernel·in_channels, is at least kSparseMinRow floats long). 0 turns the
  // sparse path off, 1 uses it for every sample (tests compare the two).
  static constexpr double kDefaultSparseDensity = 0.3;
  static constexpr std::int64_t kSparseMinRow = 16;
  void set_sparse_backward_density(double max_density) { sparse_density_ = max_density; }

 private:
  void infer_input_size(const std::vector<Shape>& inputs) override;  // Options: C from the input
  // Allocates W (and the bias) and draws W.
  void allocate_parameters(const InitSpec& init, Rng& rng) override;

  struct Geometry {
    std::int64_t n, h, w, ho, wo;
  };
  Geometry geometry(const Tensor& x) const;
  // One sample: x [C, H, W] -> cols [C·k·k, Ho·Wo]; and its adjoint, accumulating into gx [C, H, W].
  void im2col(const float* x, const Geometry& g, float* cols) const;
  void col2im(const float* cols, const Geometry& g, float* gx) const;
  // The sparse backward path for one sample (see backward): x [C, H, W], g [O, Ho·Wo]; adds to
  // grad_wp (layout [O, k, k, C]) and, when gx is not null, writes gx [C, H, W].
  void sparse_backward_sample(const float* x, const float* g, const Geometry& geo, const float* wp,
                              float* xpad, float* gxpad, float* grad_wp, float* gx) const;
  // ConfigError unless every size is positive (padding non-negative).
  void check_sizes() const;
  // Makes sure every per-thread scratch buffer exists for `threads` threads.
  void ensure_thread_buffers(int threads, std::int64_t col_size, std::int64_t pad_size = 0);

  std::int64_t in_ch_, out_ch_, kernel_, stride_, pad_;
  std::vector<Tensor> thread_cols_;  // per thread [C·k·k, Ho·Wo]: columns or column gradients
  std::vector<Tensor> thread_grad_w_, thread_grad_b_;  // per-thread partial weight / bias gradients
  // Sparse backward: working weights as [O, k, k, C]; per thread the padded channels-last input and
  // input gradient [H + 2·pad, W + 2·pad, C], and the partial weight gradient as [O, k, k, C].
  double sparse_density_ = kDefaultSparseDensity;
  Tensor weight_work_hwc_;
  std::vector<Tensor> thread_xpad_, thread_gxpad_, thread_grad_wp_;
};

}  // namespace gradscale
