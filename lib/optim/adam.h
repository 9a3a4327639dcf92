// Adam (coupled L2 weight decay) and AdamW (decoupled weight decay), exactly as torch.optim.Adam and
// torch.optim.AdamW (amsgrad off): fp32 moments, bias correction from the applied-step count.
#pragma once

#include <nlohmann/json.hpp>

#include "lib/optim/optimizer.h"

namespace gradscale {

class Adam final : public Optimizer {
 public:
  struct Options {
    double beta1 = 0.9;         // [0, 1)
    double beta2 = 0.999;       // [0, 1)
    double eps = 1e-8;          // (0, inf)
    double weight_decay = 0.0;  // [0, inf); from_json's default is 0.01 for AdamW, as in torch
    bool decoupled = false;     // false: Adam (d = g + wd * w); true: AdamW (w *= 1 - lr * wd)
    // Reads {"name":"adam"|"adamw", "beta1", "beta2", "eps", "weight_decay"}; ConfigError names a bad key.
    static Options from_json(const nlohmann::json& cfg);
  };

  // Per element, in fp32, step t = 1, 2, ... (torch's single-tensor order of operations; the bias
  // corrections are computed in double, like torch's Python scalars, then enter as floats):
  //   AdamW: w = w * (1 - lr * wd)        Adam: g = g + wd * w      (when wd != 0 and
  //   Parameter::weight_decay) m = beta1 * m + (1 - beta1) * g v = beta2 * v + (1 - beta2) * g * g w = w -
  //   (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
  // Throws ConfigError for options out of range. State slots: "exp_avg" (m), "exp_avg_sq" (v).
  explicit Adam(const Options& options);

  const Options& options() const { return options_; }
  nlohmann::json config() const override;

 protected:
  void update(Parameter& param, std::vector<Tensor>& slots, std::int64_t step, double lr) override;

 private:
  Options options_;
};

}  // namespace gradscale
