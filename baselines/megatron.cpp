// Policy `megatron`: Megatron-LM DynamicGradScaler (see megatron.h).
#include "baselines/megatron.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "baselines/params.h"
#include "lib/scaler/scale_range.h"
#include "lib/core/error.h"

namespace gradscale::baselines {
namespace {

struct MegatronConfig {
  float initial_scale;
  float min_scale;
  float growth_factor;
  float backoff_factor;
  std::int64_t growth_interval;
  std::int64_t hysteresis;
};

class MegatronScaler final : public Scaler {
 public:
  explicit MegatronScaler(const MegatronConfig& c)
      : c_(c), scale_(c.initial_scale), hysteresis_tracker_(c.hysteresis) {}
  std::string policy() const override { return "megatron"; }
  double loss_scale() const override { return scale_; }

  StepReport update(const StepStatistics& stats) override {
    if (stats.found_inf) {
      growth_tracker_ = 0;
      hysteresis_tracker_ -= 1;
      if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * c_.backoff_factor, c_.min_scale);
    } else {
      growth_tracker_ += 1;
      if (growth_tracker_ == c_.growth_interval) {
        growth_tracker_ = 0;
        hysteresis_tracker_ = c_.hysteresis;
        scale_ = scale_ * c_.growth_factor;
      }
    }
    return {stats.found_inf, scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "megatron"},
            {"initial_scale", c_.initial_scale},
            {"min_scale", c_.min_scale},
            {"growth_factor", c_.growth_factor},
            {"backoff_factor", c_.backoff_factor},
            {"growth_interval", c_.growth_interval},
            {"hysteresis", c_.hysteresis}};
  }
  // JSON has no inf: a scale grown past float32 (see megatron.h) is written as the string "inf".
  nlohmann::json state() const override {
    const nlohmann::json scale = std::isinf(scale_) ? nlohmann::json("inf") : nlohmann::json(scale_);
    return {
        {"scale", scale}, {"growth_tracker", growth_tracker_}, {"hysteresis_tracker", hysteresis_tracker_}};
  }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "megatron", {"scale", "growth_tracker", "hysteresis_tracker"});
    const bool inf = r.has("scale") && state.at("scale") == "inf";
    const float scale =
        inf ? std::numeric_limits<float>::infinity() : state_f32(r, "scale", at_least(c_.min_scale));
    const std::int64_t growth = r.required_integer("growth_tracker", 0, c_.growth_interval - 1);
    const std::int64_t hysteresis = r.required_integer("hysteresis_tracker", -kMaxInt64, c_.hysteresis);
    scale_ = scale;
    growth_tracker_ = growth;
    hysteresis_tracker_ = hysteresis;
  }

 private:
  MegatronConfig c_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t hysteresis_tracker_;
};

}  // namespace

std::unique_ptr<Scaler> make_megatron_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r = config_reader(
      config, "megatron",
      {"initial_scale", "min_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis"});
  MegatronConfig c{};
  c.initial_scale = number_f32(r, "initial_scale", 4294967296.0f, above(0));
  c.min_scale = number_f32(r, "min_scale", 1.0f, above(0));
  check_scale_range("megatron", "initial_scale", c.initial_scale);
  check_scale_range("megatron", "min_scale", c.min_scale);
  c.growth_factor = number_f32(r, "growth_factor", 2.0f, above(1));
  c.backoff_factor = number_f32(r, "backoff_factor", 0.5f, open_interval(0, 1));
  c.growth_interval = r.integer("growth_interval", 1000, 1, kMaxInt64);
  c.hysteresis = r.integer("hysteresis", 2, 1, kMaxInt64);
  GS_CHECK_CONFIG(c.min_scale <= c.initial_scale, r.context() << ": 'min_scale' (" << number_text(c.min_scale)
                                                              << ") must not exceed 'initial_scale' ("
                                                              << number_text(c.initial_scale) << ")");
  return std::make_unique<MegatronScaler>(c);
}

}  // namespace gradscale::baselines
