// Policy `apex`: Apex dynamic LossScaler (see apex.h).
#include "baselines/apex.h"

#include <algorithm>
#include <optional>

#include "baselines/params.h"
#include "lib/scaler/scale_range.h"
#include "lib/core/error.h"

namespace gradscale::baselines {
namespace {

struct ApexConfig {
  double init_scale;
  std::int64_t scale_window;
  std::optional<double> min_scale;
  double max_scale;
};

class ApexScaler final : public Scaler {
 public:
  explicit ApexScaler(const ApexConfig& c) : c_(c), loss_scale_(std::min(c.max_scale, c.init_scale)) {}
  std::string policy() const override { return "apex"; }
  double loss_scale() const override { return loss_scale_; }

  StepReport update(const StepStatistics& stats) override {
    if (stats.found_inf) {
      loss_scale_ = c_.min_scale ? std::max(*c_.min_scale, loss_scale_ / 2.0) : loss_scale_ / 2.0;
      unskipped_ = 0;
    } else {
      unskipped_ += 1;
    }
    if (unskipped_ == c_.scale_window) {
      loss_scale_ = std::min(c_.max_scale, loss_scale_ * 2.0);
      unskipped_ = 0;
    }
    return {stats.found_inf, loss_scale_, state()};
  }

  nlohmann::json config() const override {
    return {{"policy", "apex"},
            {"init_scale", c_.init_scale},
            {"scale_window", c_.scale_window},
            {"min_scale", c_.min_scale ? nlohmann::json(*c_.min_scale) : nlohmann::json(nullptr)},
            {"max_scale", c_.max_scale}};
  }
  nlohmann::json state() const override { return {{"loss_scale", loss_scale_}, {"unskipped", unskipped_}}; }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "apex", {"loss_scale", "unskipped"});
    const double scale =
        r.required_number("loss_scale", closed_interval(c_.min_scale.value_or(0.0), c_.max_scale));
    const std::int64_t unskipped = r.required_integer("unskipped", 0, c_.scale_window - 1);
    loss_scale_ = scale;
    unskipped_ = unskipped;
  }

 private:
  ApexConfig c_;
  double loss_scale_;
  std::int64_t unskipped_ = 0;
};

}  // namespace

std::unique_ptr<Scaler> make_apex_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r =
      config_reader(config, "apex", {"init_scale", "scale_window", "min_scale", "max_scale"});
  ApexConfig c{};
  c.init_scale = r.number("init_scale", 65536.0, above(0));
  c.scale_window = r.integer("scale_window", 2000, 1, kMaxInt64);
  c.min_scale = optional_number(r, config, "min_scale", above(0));
  c.max_scale = r.number("max_scale", 16777216.0, above(0));
  check_scale_range("apex", "init_scale", c.init_scale);
  check_scale_range("apex", "max_scale", c.max_scale);
  if (c.min_scale) check_scale_range("apex", "min_scale", *c.min_scale);
  const double first = std::min(c.max_scale, c.init_scale);
  GS_CHECK_CONFIG(!c.min_scale || *c.min_scale <= first,
                  r.context() << ": 'min_scale' (" << number_text(c.min_scale.value_or(0.0))
                              << ") must not exceed the first scale min(init_scale, max_scale) ("
                              << number_text(first) << ")");
  return std::make_unique<ApexScaler>(c);
}

}  // namespace gradscale::baselines
