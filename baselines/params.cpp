// Checked reading of scaler configuration and state (see params.h).
#include "baselines/params.h"

#include <cmath>

#include "lib/core/error.h"

namespace gradscale::baselines {

ConfigReader config_reader(const nlohmann::json& config, const std::string& policy,
                           std::vector<std::string> parameters) {
  parameters.insert(parameters.begin(), "policy");
  return ConfigReader(config, "scaler '" + policy + "'", std::move(parameters));
}

ConfigReader state_reader(const nlohmann::json& state, const std::string& policy,
                          std::vector<std::string> counters) {
  return ConfigReader(state, "scaler '" + policy + "' state", std::move(counters));
}

float number_f32(const ConfigReader& reader, const char* key, float fallback, const Interval& range) {
  if (!reader.has(key)) return fallback;
  const double x = reader.number(key, 0.0, range);
  const float f = static_cast<float>(x);
  GS_CHECK_CONFIG(std::isfinite(f) && range.contains(static_cast<double>(f)),
                  reader.context() << ": '" << key << "' must be in " << range.text() << " as a float32, got "
                                   << number_text(x) << " (float32: " << number_text(static_cast<double>(f))
                                   << ")");
  return f;
}

std::optional<double> optional_number(const ConfigReader& reader, const nlohmann::json& config,
                                      const char* key, const Interval& range) {
  if (!reader.has(key) || config.at(key).is_null()) return std::nullopt;
  return reader.number(key, 0.0, range);
}

float state_f32(const ConfigReader& reader, const char* key, const Interval& range) {
  const double x = reader.required_number(key, range);
  const float f = static_cast<float>(x);
  GS_CHECK_CONFIG(static_cast<double>(f) == x, reader.context()
                                                   << ": '" << key
                                                   << "' must be a float32 value (the policy keeps it "
                                                      "in float32), got "
                                                   << number_text(x));
  return f;
}

std::string number_text(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return nlohmann::json(x).dump();
}

}  // namespace gradscale::baselines
