// Policy `cerebras`: Cerebras GradScaler (see cerebras.h).
#include "baselines/cerebras.h"

#include <algorithm>

#include "baselines/params.h"
#include "lib/core/error.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::baselines {
namespace {

struct CerebrasConfig {
  float init_scale;
  std::int64_t steps_per_increase;
  float min_scale;
  float max_scale;
  float overflow_tolerance;
};

constexpr float kMinAllowed = 0x1p-14f;  // cstorch: "min_loss_scale too small" below 2^-14

class CerebrasScaler final : public Scaler {
 public:
  explicit CerebrasScaler(const CerebrasConfig& c)
      : c_(c), loss_scale_(std::min(c.max_scale, c.init_scale)) {}
  std::string policy() const override { return "cerebras"; }
  double loss_scale() const override { return loss_scale_; }

  StepReport update(const StepStatistics& stats) override {
    steps_ += 1;
    if (stats.found_inf) {
      overflows_ += 1;
      skipped_ += 1;
    }
    const float ratio = static_cast<float>(overflows_) / static_cast<float>(steps_);
    if (c_.overflow_tolerance < ratio) {
      loss_scale_ /= 2.0f;
      steps_ = overflows_ = 0;
    }
    if (c_.steps_per_increase < steps_) {
      loss_scale_ *= 2.0f;
      steps_ = overflows_ = 0;
    }
    // cstorch clamps with where(scale < max, scale, max), then where(min < scale, scale, min).
    loss_scale_ = loss_scale_ < c_.max_scale ? loss_scale_ : c_.max_scale;
    loss_scale_ = c_.min_scale < loss_scale_ ? loss_scale_ : c_.min_scale;
    return {stats.found_inf, loss_scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "cerebras"},
            {"init_scale", c_.init_scale},
            {"steps_per_increase", c_.steps_per_increase},
            {"min_scale", c_.min_scale},
            {"max_scale", c_.max_scale},
            {"overflow_tolerance", c_.overflow_tolerance}};
  }
  nlohmann::json state() const override {
    return {{"loss_scale", loss_scale_},
            {"steps_since_rescale", steps_},
            {"overflows_since_rescale", overflows_},
            {"num_skipped_steps", skipped_}};
  }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r =
        state_reader(state, "cerebras",
                     {"loss_scale", "steps_since_rescale", "overflows_since_rescale", "num_skipped_steps"});
    const float scale = state_f32(r, "loss_scale", closed_interval(c_.min_scale, c_.max_scale));
    const std::int64_t steps = r.required_integer("steps_since_rescale", 0, c_.steps_per_increase);
    const std::int64_t overflows = r.required_integer("overflows_since_rescale", 0, steps);
    const std::int64_t skipped = r.required_integer("num_skipped_steps", 0, kMaxInt64);
    loss_scale_ = scale;
    steps_ = steps;
    overflows_ = overflows;
    skipped_ = skipped;
  }

 private:
  CerebrasConfig c_;
  float loss_scale_;
  std::int64_t steps_ = 0;
  std::int64_t overflows_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace

std::unique_ptr<Scaler> make_cerebras_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r =
      config_reader(config, "cerebras",
                    {"init_scale", "steps_per_increase", "min_scale", "max_scale", "overflow_tolerance"});
  CerebrasConfig c{};
  c.init_scale = number_f32(r, "init_scale", 32768.0f, above(0));
  c.steps_per_increase = r.integer("steps_per_increase", 2000, 1, kMaxInt64 - 1);
  c.min_scale = number_f32(r, "min_scale", kMinAllowed, at_least(kMinAllowed));
  c.max_scale = number_f32(r, "max_scale", 32768.0f, above(0));
  check_scale_range("cerebras", "init_scale", c.init_scale);
  check_scale_range("cerebras", "max_scale", c.max_scale);
  c.overflow_tolerance = number_f32(r, "overflow_tolerance", 0.0f, {0, 1, false, true});
  const float first = std::min(c.max_scale, c.init_scale);
  GS_CHECK_CONFIG(c.min_scale <= first, r.context() << ": 'min_scale' (" << number_text(c.min_scale)
                                                    << ") must not exceed the first scale min(init_scale, "
                                                       "max_scale) ("
                                                    << number_text(first) << ")");
  return std::make_unique<CerebrasScaler>(c);
}

}  // namespace gradscale::baselines
