// Policy `deepspeed`: DeepSpeed DynamicLossScaler (see deepspeed.h).
#include "baselines/deepspeed.h"

#include <algorithm>

#include "baselines/params.h"
#include "lib/scaler/scale_range.h"
#include "lib/core/error.h"

namespace gradscale::baselines {
namespace {

struct DeepSpeedConfig {
  double init_scale;
  std::int64_t scale_window;
  double min_scale;
  std::int64_t hysteresis;
  bool consecutive_hysteresis;
  bool raise_at_min;
  bool legacy_growth;
};

constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor; its config does not expose it

class DeepSpeedScaler final : public Scaler {
 public:
  explicit DeepSpeedScaler(const DeepSpeedConfig& c)
      : c_(c), cur_scale_(c.init_scale), cur_hysteresis_(c.hysteresis) {}
  std::string policy() const override { return "deepspeed"; }
  double loss_scale() const override { return cur_scale_; }

  StepReport update(const StepStatistics& stats) override {
    if (stats.found_inf) {
      if (c_.hysteresis == 1 || cur_hysteresis_ == 1) {
        if (cur_scale_ == c_.min_scale && c_.raise_at_min)
          throw ScalerError("deepspeed: current loss scale already at minimum (" + number_text(cur_scale_) +
                            ") - cannot decrease scale anymore (raise_at_min)");
        cur_scale_ = std::max(cur_scale_ / kScaleFactor, c_.min_scale);
      } else {
        cur_hysteresis_ -= 1;
      }
      last_overflow_iter_ = cur_iter_;
    } else {
      if (c_.consecutive_hysteresis) cur_hysteresis_ = c_.hysteresis;
      bool grow = false;
      if (c_.legacy_growth) {
        grow = (cur_iter_ - last_overflow_iter_) % c_.scale_window == 0;
      } else {
        const std::int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
        grow = stable_interval > 0 && stable_interval % c_.scale_window == 0;
      }
      if (grow) {
        if (!c_.consecutive_hysteresis) cur_hysteresis_ = c_.hysteresis;
        cur_scale_ *= kScaleFactor;
      }
    }
    cur_iter_ += 1;
    return {stats.found_inf, cur_scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "deepspeed"},           {"init_scale", c_.init_scale},
            {"scale_window", c_.scale_window}, {"min_scale", c_.min_scale},
            {"hysteresis", c_.hysteresis},     {"consecutive_hysteresis", c_.consecutive_hysteresis},
            {"raise_at_min", c_.raise_at_min}, {"legacy_growth", c_.legacy_growth}};
  }
  nlohmann::json state() const override {
    return {{"cur_scale", cur_scale_},
            {"cur_iter", cur_iter_},
            {"last_overflow_iter", last_overflow_iter_},
            {"cur_hysteresis", cur_hysteresis_}};
  }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r =
        state_reader(state, "deepspeed", {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"});
    const double cur_scale = r.required_number("cur_scale", at_least(c_.min_scale));
    const std::int64_t cur_iter = r.required_integer("cur_iter", 0, kMaxInt64 - 1);
    const std::int64_t last_overflow_iter = r.required_integer("last_overflow_iter", -1, cur_iter - 1);
    const std::int64_t cur_hysteresis = r.required_integer("cur_hysteresis", 1, c_.hysteresis);
    cur_scale_ = cur_scale;
    cur_iter_ = cur_iter;
    last_overflow_iter_ = last_overflow_iter;
    cur_hysteresis_ = cur_hysteresis;
  }

 private:
  DeepSpeedConfig c_;
  double cur_scale_;
  std::int64_t cur_iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
  std::int64_t cur_hysteresis_;
};

}  // namespace

std::unique_ptr<Scaler> make_deepspeed_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r = config_reader(config, "deepspeed",
                                       {"init_scale", "scale_window", "min_scale", "hysteresis",
                                        "consecutive_hysteresis", "raise_at_min", "legacy_growth"});
  DeepSpeedConfig c{};
  c.init_scale = r.number("init_scale", 65536.0, above(0));
  c.scale_window = r.integer("scale_window", 1000, 1, kMaxInt64);
  c.min_scale = r.number("min_scale", 1.0, above(0));
  check_scale_range("deepspeed", "init_scale", c.init_scale);
  check_scale_range("deepspeed", "min_scale", c.min_scale);
  c.hysteresis = r.integer("hysteresis", 2, 1, kMaxInt64);
  c.consecutive_hysteresis = r.boolean("consecutive_hysteresis", false);
  c.raise_at_min = r.boolean("raise_at_min", true);
  c.legacy_growth = r.boolean("legacy_growth", false);
  GS_CHECK_CONFIG(c.min_scale <= c.init_scale, r.context() << ": 'min_scale' (" << number_text(c.min_scale)
                                                           << ") must not exceed 'init_scale' ("
                                                           << number_text(c.init_scale) << ")");
  return std::make_unique<DeepSpeedScaler>(c);
}

}  // namespace gradscale::baselines
