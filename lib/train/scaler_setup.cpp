// The scaler a training driver runs, built in one place (see scaler_setup.h).
#include "lib/train/scaler_setup.h"

#include <string>

namespace gradscale {

std::unique_ptr<Scaler> make_scaler_for(const nlohmann::json& config, const Precision& precision) {
  if (config.is_string()) return make_scaler(config.get<std::string>(), precision.gradient_format());
  return make_scaler(config, precision.gradient_format());
}

}  // namespace gradscale
