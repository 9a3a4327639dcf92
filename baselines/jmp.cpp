// Policy `jmp`: jmp DynamicLossScale (see jmp.h).
#include "baselines/jmp.h"

#include <algorithm>
#include <cmath>

#include "baselines/params.h"
#include "lib/scaler/scale_range.h"
#include "lib/core/error.h"

namespace gradscale::baselines {
namespace {

struct JmpConfig {
  float loss_scale;
  std::int64_t period;
  float factor;
  float min_loss_scale;
};

class JmpScaler final : public Scaler {
 public:
  explicit JmpScaler(const JmpConfig& c) : c_(c), loss_scale_(c.loss_scale) {}
  std::string policy() const override { return "jmp"; }
  double loss_scale() const override { return loss_scale_; }

  StepReport update(const StepStatistics& stats) override {
    const bool finite = !stats.found_inf;
    if (finite) {
      if (counter_ == c_.period - 1) {
        const float grown = loss_scale_ * c_.factor;
        if (std::isfinite(grown)) loss_scale_ = grown;  // jmp's first_finite(grown, current)
      }
    } else {
      loss_scale_ = std::max(c_.min_loss_scale, loss_scale_ / c_.factor);
    }
    counter_ = finite ? (counter_ + 1) % c_.period : 0;
    return {stats.found_inf, loss_scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "jmp"},
            {"loss_scale", c_.loss_scale},
            {"period", c_.period},
            {"factor", c_.factor},
            {"min_loss_scale", c_.min_loss_scale}};
  }
  nlohmann::json state() const override { return {{"loss_scale", loss_scale_}, {"counter", counter_}}; }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "jmp", {"loss_scale", "counter"});
    const float scale = state_f32(r, "loss_scale", at_least(c_.min_loss_scale));
    const std::int64_t counter = r.required_integer("counter", 0, c_.period - 1);
    loss_scale_ = scale;
    counter_ = counter;
  }

 private:
  JmpConfig c_;
  float loss_scale_;
  std::int64_t counter_ = 0;
};

}  // namespace

std::unique_ptr<Scaler> make_jmp_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r = config_reader(config, "jmp", {"loss_scale", "period", "factor", "min_loss_scale"});
  JmpConfig c{};
  c.loss_scale = number_f32(r, "loss_scale", 32768.0f, above(0));
  c.period = r.integer("period", 2000, 1, kMaxInt64);
  c.factor = number_f32(r, "factor", 2.0f, above(1));
  c.min_loss_scale = number_f32(r, "min_loss_scale", 1.0f, above(0));
  check_scale_range("jmp", "loss_scale", c.loss_scale);
  check_scale_range("jmp", "min_loss_scale", c.min_loss_scale);
  GS_CHECK_CONFIG(c.min_loss_scale <= c.loss_scale,
                  r.context() << ": 'min_loss_scale' (" << number_text(c.min_loss_scale)
                              << ") must not exceed 'loss_scale' (" << number_text(c.loss_scale) << ")");
  return std::make_unique<JmpScaler>(c);
}

}  // namespace gradscale::baselines
