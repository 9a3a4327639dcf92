// Linear layer y = x·Wᵀ + b (SPEC §5): the upstream gradient g·W is computed in fp32, scaled by the
// controller's local scale s before one rounding to F, and carried at scale s·S; weight and bias
// gradients are rounded to F and unscaled into the fp32 master gradients.
#pragma once

#include <optional>

#include "lib/layers/init.h"
#include "lib/layers/layer.h"

namespace gradscale {

class Linear final : public Layer {
 public:
  // Input [N, in] (or any [N, ...] with in elements per sample), output [N, out]. W: [out, in].
  Linear(std::string name, std::int64_t in, std::int64_t out, bool bias, const InitSpec& init, Rng& rng);

  // The same by named options: Linear("fc", Linear::Options{}.out_features(10)). in_features, when not
  // given, is the input's features per sample; the weights are drawn at Model::finalize from the
  // generator given there (Model::finalize(shape, rng)), in layer order. Required: out_features.
  class Options {
   public:
    Options& in_features(std::int64_t n) { return in_ = n, *this; }  // default: from the input
    Options& out_features(std::int64_t n) { return out_ = n, *this; }
    Options& bias(bool b) { return bias_ = b, *this; }                // default true
    Options& init(const InitSpec& i) { return init_ = i, *this; }     // default Kaiming normal, gain √2

   private:
    friend class Linear;
    std::int64_t in_ = 0, out_ = 0;
    bool bias_ = true;
    InitSpec init_;
  };
  Linear(std::string name, const Options& options);

  std::string kind() const override { return "linear"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override;
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext& ctx) override;
  void backward(const std::vector<const Tensor*>& inputs, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext& ctx) override;
  std::vector<Parameter*> parameters() override;
  void prepare_weights(const Precision& p) override;
  void infer_sizes(const std::vector<Shape>& inputs, Rng* init_rng) override;  // Options: in, then W
  nlohmann::json describe() const override;
  std::int64_t reduction_length() const override { return out_; }  // K = out (SPEC §6.1)
  // The output is rounded to F and the input gradient to the gradient format.
  bool output_in_format(bool) const override { return true; }
  bool input_grads_in_format(bool) const override { return true; }

 private:
  void allocate_parameters(const InitSpec& init, Rng& rng);

  std::int64_t in_, out_;
  bool has_bias_;
  std::optional<InitSpec> deferred_init_;  // built from Options: W is drawn at finalize
  Parameter weight_, bias_;
  Tensor weight_work_, bias_work_;  // working copies in F
  Tensor grad_w_, grad_b_;          // fp32 scratch for the weight gradients
};

}  // namespace gradscale
