// What Linear and Conv2d share (SPEC §4–§5): a weight W and an optional bias b kept as fp32 masters
// with their master gradients, working copies in F refreshed once per step, and fp32 scratch for the
// weight gradients at scale S. Both round their output to F and their input gradient to the gradient
// format.
#pragma once

#include <optional>
#include <vector>

#include "lib/layers/init.h"
#include "lib/layers/layer.h"

namespace gradscale {

class ParametricLayer : public Layer {
 public:
  std::vector<Parameter*> parameters() override;  // W, then b when there is one
  // Working copies = round(masters, F).
  void prepare_weights(const Precision& p) override;
  // Built from Options: the input size from `inputs` (infer_input_size), then W drawn from *init_rng
  // (ConfigError when it is null). Built with every size: nothing to do.
  void infer_sizes(const std::vector<Shape>& inputs, Rng* init_rng) override;
  // The output is rounded to F and the input gradient to the gradient format.
  bool output_in_format(bool) const override { return true; }
  bool input_grads_in_format(bool) const override { return true; }

 protected:
  // With every size: the subclass allocates and draws W in its constructor.
  ParametricLayer(std::string name, bool bias) : Layer(std::move(name)), has_bias_(bias) {}
  // From `options` (the Options class, named in errors) without the input size: W is drawn with
  // `init` at finalize.
  ParametricLayer(std::string name, bool bias, const InitSpec& init, const char* options)
      : Layer(std::move(name)), has_bias_(bias), deferred_init_(init), options_(options) {}

  // Built from Options: sets the input size that was left out from the input shapes, or checks them
  // (ShapeError when they do not fit).
  virtual void infer_input_size(const std::vector<Shape>& inputs) = 0;
  // Allocates W and the bias and draws W (allocate_weight_and_bias with the layer's shapes and fans).
  virtual void allocate_parameters(const InitSpec& init, Rng& rng) = 0;
  // W: `weight_shape`, drawn from `init` with these fans; bias: [bias_size] at 0, without weight decay;
  // master gradients at 0.
  void allocate_weight_and_bias(const Shape& weight_shape, std::int64_t bias_size, std::int64_t fan_in,
                                std::int64_t fan_out, const InitSpec& init, Rng& rng);
  // SPEC §5 step 3: grad_w_ (and grad_b_) at scale S rounded and unscaled into the master gradients.
  void accumulate_parameter_grads(double scale, BackwardContext& ctx);

  bool has_bias_;
  Parameter weight_, bias_;
  Tensor weight_work_, bias_work_;  // working copies in F
  Tensor grad_w_, grad_b_;          // fp32 weight gradients at scale S

 private:
  std::optional<InitSpec> deferred_init_;  // built from Options: W is drawn at finalize
  const char* options_ = nullptr;
};

}  // namespace gradscale
