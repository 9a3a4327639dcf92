// Policy `torch`: PyTorch GradScaler (see torch.h).
#include "baselines/torch.h"

#include <cmath>

#include "baselines/params.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::baselines {
namespace {

struct TorchConfig {
  float init_scale;
  double growth_factor;
  double backoff_factor;
  std::int64_t growth_interval;
};

class TorchScaler final : public Scaler {
 public:
  explicit TorchScaler(const TorchConfig& c) : c_(c), scale_(c.init_scale) {}
  std::string policy() const override { return "torch"; }
  double loss_scale() const override { return scale_; }

  StepReport update(const StepStatistics& stats) override {
    if (stats.found_inf) {
      scale_ = static_cast<float>(static_cast<double>(scale_) * c_.backoff_factor);
      growth_tracker_ = 0;
    } else {
      const std::int64_t successful = growth_tracker_ + 1;
      if (successful == c_.growth_interval) {
        const float grown = static_cast<float>(static_cast<double>(scale_) * c_.growth_factor);
        if (std::isfinite(grown)) scale_ = grown;
        growth_tracker_ = 0;
      } else {
        growth_tracker_ = successful;
      }
    }
    return {stats.found_inf, scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "torch"},
            {"init_scale", c_.init_scale},
            {"growth_factor", c_.growth_factor},
            {"backoff_factor", c_.backoff_factor},
            {"growth_interval", c_.growth_interval}};
  }
  nlohmann::json state() const override { return {{"scale", scale_}, {"growth_tracker", growth_tracker_}}; }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "torch", {"scale", "growth_tracker"});
    const float scale = state_f32(r, "scale", at_least(0));
    const std::int64_t tracker = r.required_integer("growth_tracker", 0, c_.growth_interval - 1);
    scale_ = scale;
    growth_tracker_ = tracker;
  }

 private:
  TorchConfig c_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
};

}  // namespace

std::unique_ptr<Scaler> make_torch_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r =
      config_reader(config, "torch", {"init_scale", "growth_factor", "backoff_factor", "growth_interval"});
  TorchConfig c{};
  c.init_scale = number_f32(r, "init_scale", 65536.0f, above(0));
  check_scale_range("torch", "init_scale", c.init_scale);
  c.growth_factor = r.number("growth_factor", 2.0, above(1));
  c.backoff_factor = r.number("backoff_factor", 0.5, open_interval(0, 1));
  c.growth_interval = r.integer("growth_interval", 2000, 1, kMaxInt32);
  return std::make_unique<TorchScaler>(c);
}

}  // namespace gradscale::baselines
