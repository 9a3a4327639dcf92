// Controllers by name (see scaler.h): a user's LayerController, run under the built-in loss-level
// policy "adaptive" by configuration ({"policy": "adaptive", "controller": NAME}).
#include <map>
#include <mutex>

#include "lib/core/json_read.h"
#include "lib/scaler/scaler.h"

namespace gradscale {
namespace {

struct ControllerRegistry {
  std::mutex mutex;
  std::map<std::string, ControllerFactory> factories;
};

ControllerRegistry& controllers() {
  static ControllerRegistry r;
  return r;
}

}  // namespace

void register_controller(const std::string& name, ControllerFactory factory) {
  GS_CHECK(!name.empty(), "a controller needs a name");
  GS_CHECK(factory != nullptr, "no factory given for controller '" << name << "'");
  ControllerRegistry& r = controllers();
  const std::lock_guard<std::mutex> lock(r.mutex);
  GS_CHECK(r.factories.emplace(name, std::move(factory)).second, "controller '" << name << "' is already registered");
}

std::vector<std::string> controller_names() {
  ControllerRegistry& r = controllers();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.factories) names.push_back(entry.first);
  return names;
}

std::unique_ptr<LayerController> make_controller(const std::string& name, const nlohmann::json& config,
                                                 Format grad_format) {
  ControllerFactory factory;
  {
    ControllerRegistry& r = controllers();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : controller_names()) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("unknown controller '" + text_excerpt(name) + "' (registered: " +
                      (known.empty() ? "none; register_controller(name, factory) adds one" : known) + ")");
  }
  std::unique_ptr<LayerController> c = factory(config, grad_format);
  GS_CHECK(c != nullptr, "the factory of controller '" << name << "' returned no controller");
  return c;
}

}  // namespace gradscale
