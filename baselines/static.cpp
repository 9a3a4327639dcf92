// Policy `static` (see static.h).
#include "baselines/static.h"

#include "baselines/params.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::baselines {
namespace {

class StaticScaler final : public Scaler {
 public:
  explicit StaticScaler(double scale) : scale_(scale) {}
  std::string policy() const override { return "static"; }
  double loss_scale() const override { return scale_; }
  StepReport update(const StepStatistics& stats) override { return {stats.found_inf, scale_, state()}; }
  nlohmann::json config() const override { return {{"policy", "static"}, {"scale", scale_}}; }
  nlohmann::json state() const override { return nlohmann::json::object(); }
  void restore_state(const nlohmann::json& state) override { state_reader(state, "static", {}); }

 private:
  double scale_;
};

}  // namespace

std::unique_ptr<Scaler> make_static_scaler(const nlohmann::json& config, Format /*format*/) {
  const ConfigReader r = config_reader(config, "static", {"scale"});
  const double scale = r.required_number("scale", above(0));
  check_scale_range("static", "scale", scale);
  return std::make_unique<StaticScaler>(scale);
}

}  // namespace gradscale::baselines
