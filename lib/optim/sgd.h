// Stochastic gradient descent with momentum, Nesterov momentum and coupled L2 weight decay, exactly as
// torch.optim.SGD (dampening 0): the master weights of SPEC §4 are updated in fp32.
#pragma once

#include <nlohmann/json.hpp>

#include "lib/optim/optimizer.h"

namespace gradscale {

class Sgd final : public Optimizer {
 public:
  struct Options {
    double momentum = 0.0;      // [0, 1); 0 keeps no state
    bool nesterov = false;      // requires momentum > 0
    double weight_decay = 0.0;  // [0, inf): coupled L2, d = g + weight_decay * w
    // Reads {"name":"sgd", "momentum", "nesterov", "weight_decay"}; ConfigError names a bad key.
    static Options from_json(const nlohmann::json& cfg);
  };

  // Per element, in fp32 (torch.optim.SGD's order of operations):
  //   d = g + wd * w                     (only when wd != 0 and Parameter::weight_decay)
  //   b = d on the first step, else b = momentum * b + d
  //   u = d + momentum * b if nesterov, else b (or d when momentum == 0)
  //   w = w - lr * u
  // Throws ConfigError for options out of range. State slot: "momentum_buffer" (when momentum > 0).
  explicit Sgd(const Options& options);

  const Options& options() const { return options_; }
  nlohmann::json config() const override;

 protected:
  void update(Parameter& param, std::vector<Tensor>& slots, std::int64_t step, double lr) override;

 private:
  Options options_;
};

}  // namespace gradscale
