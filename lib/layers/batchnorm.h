// Batch normalisation over the channel dimension (SPEC §4–§5): statistics in double from the F inputs,
// output rounded to F. Its backward is linear in the incoming gradient g, so the input gradient keeps
// the scale S (rounded to F once) and dγ, dβ are unscaled by S like any weight gradient.
#pragma once

#include <vector>

#include "lib/layers/layer.h"

namespace gradscale {

class BatchNorm final : public Layer {
 public:
  // Input [N, C] (1d) or [N, C, H, W] (2d) with C = channels; output of the same shape.
  // γ (".weight", starts at 1) and β (".bias", starts at 0) are Parameters without weight decay;
  // running mean / variance start at 0 / 1 and follow PyTorch: r = (1 − momentum)·r + momentum·batch,
  // with the unbiased batch variance for the running variance.
  BatchNorm(std::string name, std::int64_t channels, double eps = 1e-5, double momentum = 0.1);

  // The same by named options: BatchNorm("bn1", BatchNorm::Options{}) takes C from its input at
  // Model::finalize; BatchNorm::Options{}.momentum(0.01) changes one setting.
  class Options {
   public:
    Options& channels(std::int64_t c) { return channels_ = c, *this; }  // default: the input's C
    Options& eps(double e) { return eps_ = e, *this; }                  // default 1e-5
    Options& momentum(double m) { return momentum_ = m, *this; }        // default 0.1

   private:
    friend class BatchNorm;
    std::int64_t channels_ = 0;
    double eps_ = 1e-5, momentum_ = 0.1;
  };
  BatchNorm(std::string name, const Options& options);

  std::string kind() const override { return "batchnorm"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  // Training: normalises with the batch mean and biased variance over N (and H·W) and updates the
  // running statistics; needs at least 2 values per channel. Eval: uses the running statistics.
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  // Backward of the mode of the last forward (training: through the batch statistics).
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  std::vector<Parameter*> parameters() override { return {&gamma_, &beta_}; }
  void prepare_weights(const Precision& p) override;
  // "<name>.running_mean" and "<name>.running_var", both [C] in fp32.
  std::vector<std::pair<std::string, Tensor*>> buffers() override;
  void infer_sizes(const std::vector<Shape>& inputs, Rng* init_rng) override;  // Options: C
  nlohmann::json describe() const override;
  // The output is rounded to F and the input gradient to the gradient format.
  bool output_in_format(bool) const override { return true; }
  bool input_grads_in_format(bool) const override { return true; }

 private:
  // Batch size and plane size (H·W, or 1 for [N, C]) of an input.
  struct Layout {
    std::int64_t n, plane;
  };
  Layout layout(const Shape& s) const;
  void check_settings() const;
  void allocate(std::int64_t channels);

  std::int64_t channels_;
  double eps_, momentum_;
  Parameter gamma_, beta_;
  Tensor gamma_work_, beta_work_;  // working copies in F
  Tensor running_mean_, running_var_;
  std::vector<double> mean_, invstd_;   // statistics the last forward normalised with
  std::vector<double> sum_g_, sum_gx_;  // backward scratch: Σg and Σg·x̂ per channel
  bool last_training_ = true;
  Tensor grad_gamma_, grad_beta_;  // fp32 gradients at scale S
};

}  // namespace gradscale
