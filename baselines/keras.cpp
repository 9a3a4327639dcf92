// Policy `keras`: tf-keras dynamic loss scale (see keras.h).
#include "baselines/keras.h"

#include <algorithm>
#include <cmath>

#include "baselines/params.h"

namespace gradscale::baselines {
namespace {

constexpr float kMultiplier = 2.0f;  // fixed by LossScaleOptimizer
constexpr float kFloor = 1.0f;       // tf.maximum(scale / multiplier, 1)

class KerasScaler final : public Scaler {
 public:
  KerasScaler(float initial_scale, std::int64_t growth_steps)
      : initial_scale_(initial_scale), growth_steps_(growth_steps), scale_(initial_scale) {}
  std::string policy() const override { return "keras"; }
  double loss_scale() const override { return scale_; }

  StepReport update(const StepStatistics& stats) override {
    if (!stats.found_inf) {
      if (good_steps_ + 1 >= growth_steps_) {
        const float grown = scale_ * kMultiplier;
        if (std::isfinite(grown)) scale_ = grown;
        good_steps_ = 0;
      } else {
        good_steps_ += 1;
      }
    } else {
      scale_ = std::max(scale_ / kMultiplier, kFloor);
      good_steps_ = 0;
    }
    return {stats.found_inf, scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "keras"}, {"initial_scale", initial_scale_}, {"growth_steps", growth_steps_}};
  }
  nlohmann::json state() const override {
    return {{"current_loss_scale", scale_}, {"good_steps", good_steps_}};
  }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "keras", {"current_loss_scale", "good_steps"});
    const float scale = state_f32(r, "current_loss_scale", at_least(kFloor));
    const std::int64_t good = r.required_integer("good_steps", 0, growth_steps_ - 1);
    scale_ = scale;
    good_steps_ = good;
  }

 private:
  float initial_scale_;
  std::int64_t growth_steps_;
  float scale_;
  std::int64_t good_steps_ = 0;
};

}  // namespace

std::unique_ptr<Scaler> make_keras_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r = config_reader(config, "keras", {"initial_scale", "growth_steps"});
  const float initial = number_f32(r, "initial_scale", 32768.0f, at_least(kFloor));
  const std::int64_t growth_steps = r.integer("growth_steps", 2000, 1, kMaxInt64);
  return std::make_unique<KerasScaler>(initial, growth_steps);
}

}  // namespace gradscale::baselines
