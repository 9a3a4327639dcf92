// Linear layer y = x·Wᵀ + b (SPEC §5): the upstream gradient g·W is computed in fp32, scaled by the
// controller's local scale s before one rounding to F, and carried at scale s·S; weight and bias
// gradients are rounded to F and unscaled into the fp32 master gradients.
#pragma once

#include "lib/layers/parametric_layer.h"

namespace gradscale {

class Linear final : public ParametricLayer {
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
  nlohmann::json describe() const override;
  std::int64_t reduction_length() const override { return out_; }  // K = out (SPEC §6.1)

 private:
  void infer_input_size(const std::vector<Shape>& inputs) override;  // Options: in from the input
  void allocate_parameters(const InitSpec& init, Rng& rng) override;

  std::int64_t in_, out_;
};

}  // namespace gradscale
