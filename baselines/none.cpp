// Policy `none` (see none.h).
#include "baselines/none.h"

#include "baselines/params.h"

namespace gradscale::baselines {
namespace {

class NoneScaler final : public Scaler {
 public:
  std::string policy() const override { return "none"; }
  double loss_scale() const override { return 1.0; }
  StepReport update(const StepStatistics& stats) override { return {stats.found_inf, 1.0, state()}; }
  nlohmann::json config() const override { return {{"policy", "none"}}; }
  nlohmann::json state() const override { return nlohmann::json::object(); }
  void restore_state(const nlohmann::json& state) override { state_reader(state, "none", {}); }
};

}  // namespace

std::unique_ptr<Scaler> make_none_scaler(const nlohmann::json& config, Format /*format*/) {
  config_reader(config, "none", {});
  return std::make_unique<NoneScaler>();
}

}  // namespace gradscale::baselines
