// The scaler a training driver runs, built and checked in one place (see scaler_setup.h).
#include "lib/train/scaler_setup.h"

#include "lib/core/error.h"

namespace gradscale {

std::unique_ptr<Scaler> make_scaler_for(const nlohmann::json& config, const Precision& precision) {
  if (config.is_string()) return make_scaler(config.get<std::string>(), precision.gradient_format());
  return make_scaler(config, precision.gradient_format());
}

void refuse_controller_off_gemm(Scaler& scaler, const std::vector<LayerInfo>& layers, const std::string& driver,
                                const std::string& reason) {
  const LayerController* controller = scaler.layer_controller();
  if (controller == nullptr) return;
  for (const LayerInfo& l : layers)
    GS_CHECK_CONFIG(l.parametric || !controller->acts_at(l.id),
                    driver << ": the scaler's controller acts at layer '" << l.name << "' (" << l.kind
                           << "), which is not parametric (\"control_at\": \"all\"): " << reason);
}

}  // namespace gradscale
