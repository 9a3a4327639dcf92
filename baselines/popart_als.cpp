// Policy `popart_als`: PopART automatic loss scaling (see popart_als.h).
#include "baselines/popart_als.h"

#include <algorithm>
#include <cmath>

#include "baselines/params.h"

namespace gradscale::baselines {
namespace {

struct PopartConfig {
  float initial_scale;
  float bin_edge;
  float threshold;
  std::int64_t update_period;
  float max_scale;
};

class PopartAlsScaler final : public Scaler {
 public:
  PopartAlsScaler(const PopartConfig& c, Format format)
      : c_(c),
        // PopART's histogram levels are float32: edge = location * max of the gradient's type.
        edge_(c.bin_edge * static_cast<float>(format_info(format).max_finite)),
        factor_max_(c.max_scale / c.initial_scale),
        factor_min_(1.0f / c.initial_scale) {}
  std::string policy() const override { return "popart_als"; }
  double loss_scale() const override { return c_.initial_scale * factor_; }
  double gradient_edge() const override { return edge_; }

  StepReport update(const StepStatistics& stats) override {
    counter_ = (counter_ + 1) % c_.update_period;
    if (counter_ == 0) {
      // PopART: u > f * l with f = t / (1 - t), counts cast to float32.
      const float f = c_.threshold / (1.0f - c_.threshold);
      const float upper = static_cast<float>(stats.grad_above_edge);
      const float lower = static_cast<float>(stats.grad_below_edge);
      factor_ = upper > lower * f ? factor_ * 0.5f : factor_ * 2.0f;
      factor_ = std::min(factor_, factor_max_);
      factor_ = std::max(factor_, factor_min_);
    }
    return {stats.found_inf, loss_scale(), state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "popart_als"},    {"initial_scale", c_.initial_scale}, {"bin_edge", c_.bin_edge},
            {"threshold", c_.threshold}, {"update_period", c_.update_period}, {"max_scale", c_.max_scale}};
  }
  nlohmann::json state() const override {
    return {{"loss_scale_update_factor", factor_}, {"counter", counter_}};
  }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "popart_als", {"loss_scale_update_factor", "counter"});
    // Before its first update the factor is 1 even when initial_scale is above max_scale.
    const Interval range = closed_interval(std::min(1.0f, factor_min_), std::max(1.0f, factor_max_));
    const float factor = state_f32(r, "loss_scale_update_factor", range);
    const std::int64_t counter = r.required_integer("counter", -1, c_.update_period - 1);
    factor_ = factor;
    counter_ = counter;
  }

 private:
  PopartConfig c_;
  float edge_;
  float factor_max_;
  float factor_min_;
  float factor_ = 1.0f;
  std::int64_t counter_ = -1;
};

// The largest power of two not above max_finite(F): PopART's fp16 clip 2^15, generalised.
float default_max_scale(Format format) {
  int exponent = 0;
  std::frexp(format_info(format).max_finite, &exponent);  // max_finite = m * 2^exponent, m in [0.5, 1)
  return static_cast<float>(std::ldexp(1.0, exponent - 1));
}

}  // namespace

std::unique_ptr<Scaler> make_popart_als_scaler(const nlohmann::json& config, Format format) {
  const ConfigReader r = config_reader(
      config, "popart_als", {"initial_scale", "bin_edge", "threshold", "update_period", "max_scale"});
  PopartConfig c{};
  c.initial_scale = number_f32(r, "initial_scale", 1.0f, at_least(1));
  c.bin_edge = number_f32(r, "bin_edge", 0.0625f, {0, 1, true, false});
  c.threshold = number_f32(r, "threshold", 1e-7f, closed_interval(0, 1));
  c.update_period = r.integer("update_period", 1, 1, kMaxInt32);
  c.max_scale = number_f32(r, "max_scale", default_max_scale(format), at_least(1));
  return std::make_unique<PopartAlsScaler>(c, format);
}

}  // namespace gradscale::baselines
