// 2-d convolution as im2col + GEMM (SPEC §4–§5): the forward GEMM takes F inputs and F working weights
// and accumulates in fp32; backward computes the upstream gradient Wᵀ·g + col2im in fp32, scales it by
// the controller's local scale s before one rounding to F (carried at s·S), and rounds the weight and
// bias gradients to F before unscaling them into the fp32 master gradients — the same steps as Linear.
#pragma once

#include <vector>

#include "lib/layers/init.h"
#include "lib/layers/layer.h"

namespace gradscale {

class Conv2d final : public Layer {
 public:
  // Input [N, in_channels, H, W] (values in F), output [N, out_channels, Ho, Wo] (values in F) with
  // Ho = (H + 2·padding − kernel) / stride + 1 (likewise Wo). Square kernel, zero padding.
  // W: [out_channels, in_channels, kernel, kernel], initialised with fan_in = in_channels·kernel² and
  // fan_out = out_channels·kernel²; bias [out_channels] starts at 0 and has no weight decay.
  Conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
         std::int64_t stride, std::int64_t padding, bool bias, const InitSpec& init, Rng& rng);

  std::string kind() const override { return "conv2d"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  // Parallel over the batch (OpenMP, static schedule); each thread runs single-threaded Eigen GEMMs
  // on its own column buffer (allocated once, reused while the shapes stay the same).
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // Weight gradients are summed per thread over its static block of samples and the partial sums are
  // combined in thread order: for a given thread count the result is deterministic. The columns are
  // recomputed from the input, not kept from forward: measured faster on the cnn model (they stay in
  // cache) and it saves N·C·k²·Ho·Wo floats. The upstream GEMM is skipped when grad_inputs[0] is null.
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  std::vector<Parameter*> parameters() override;
  void prepare_weights(const Precision& p) override;
  nlohmann::json describe() const override;
  std::int64_t reduction_length() const override { return out_ch_ * kernel_ * kernel_; }  // K (SPEC §6.1)

 private:
  struct Geometry {
    std::int64_t n, h, w, ho, wo;
  };
  Geometry geometry(const Tensor& x) const;
  // One sample: x [C, H, W] -> cols [C·k·k, Ho·Wo]; and its adjoint, accumulating into gx [C, H, W].
  void im2col(const float* x, const Geometry& g, float* cols) const;
  void col2im(const float* cols, const Geometry& g, float* gx) const;
  // Makes sure every per-thread scratch buffer exists for `threads` threads.
  void ensure_thread_buffers(int threads, std::int64_t col_size);

  std::int64_t in_ch_, out_ch_, kernel_, stride_, pad_;
  bool has_bias_;
  Parameter weight_, bias_;
  Tensor weight_work_, bias_work_;   // working copies in F
  std::vector<Tensor> thread_cols_;  // per thread [C·k·k, Ho·Wo]: columns or column gradients
  std::vector<Tensor> thread_grad_w_, thread_grad_b_;  // per-thread partial weight / bias gradients
  Tensor grad_w_, grad_b_;                             // fp32 weight gradients at scale S
};

}  // namespace gradscale
