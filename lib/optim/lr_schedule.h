// Learning-rate schedules (constant, step decay, cosine; each with an optional linear warm-up) as pure
// functions of the number of APPLIED optimizer steps: a step skipped for overflow (SPEC §6.4, §7) leaves
// the weights, the optimizer moments and the learning rate untouched. See docs/optim.md for why.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace gradscale {

class LrSchedule {
 public:
  enum class Kind { constant, step, cosine };

  struct Options {
    Kind kind = Kind::constant;
    double lr = 0.0;                         // base learning rate, [0, inf)
    std::int64_t step_size = 1;              // step: decay every step_size applied steps, >= 1
    double gamma = 0.1;                      // step: factor per decay, (0, 1]
    std::int64_t total_steps = 1;            // cosine: applied steps until min_lr (warm-up included)
    double min_lr = 0.0;                     // cosine: final rate, [0, lr]
    std::int64_t warmup_steps = 0;           // linear warm-up length, >= 0 (0 = none)
    double warmup_start_factor = 1.0 / 3.0;  // warm-up starts at lr * this, (0, 1] (torch LinearLR)
  };

  // Reads {"name":"constant"|"step"|"cosine", "lr", ...}: "lr" is required; "step" requires "step_size"
  // and takes "gamma"; "cosine" requires "total_steps" (> warmup_steps) and takes "min_lr"; all take
  // "warmup_steps" and "warmup_start_factor". Unknown names/keys and out-of-range values throw
  // ConfigError naming the key and the allowed range.
  static LrSchedule from_json(const nlohmann::json& cfg);
  // Validates like from_json (ConfigError).
  explicit LrSchedule(const Options& options);

  // The learning rate for the optimizer step that follows `applied_step` applied steps (0 for the
  // first update; pass Optimizer::step_count()). With W = warmup_steps, k = applied_step, j = k - W:
  //   k < W:    lr * (f + (1 - f) * k / W)                       f = warmup_start_factor
  //   constant: lr
  //   step:     lr * gamma^floor(j / step_size)
  //   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * j / (T - W))) / 2 for j < T - W, then min_lr
  // Requires applied_step >= 0 (else Error). In double; deterministic.
  double lr(std::int64_t applied_step) const;

  const Options& options() const { return options_; }
  // The resolved configuration (defaults filled in); from_json(config()) gives the same schedule.
  nlohmann::json config() const;

 private:
  Options options_;
};

}  // namespace gradscale
