// The scaler registry (see scaler.h): policy name -> factory, filled on first use with the built-in
// policies listed by the policy catalogue (builtin_scalers(), defined in policies/catalogue.cpp above
// lib/, so lib/ includes neither baselines/ nor adaptive/), and the command-line forms of a scaler spec
// (JSON object, bare policy name, static:S).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "lib/core/json_read.h"
#include "lib/scaler/scaler.h"

namespace gradscale {
namespace {

struct Registry {
  // Built-ins are added here rather than by static objects in baselines/, which a static library drops.
  Registry() {
    for (BuiltinScaler& b : builtin_scalers()) factories.emplace(b.name, Entry{std::move(b.factory), b.kind});
  }
  struct Entry {
    ScalerFactory factory;
    ScalerKind kind;
  };
  std::mutex mutex;
  std::map<std::string, Entry> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

// "apex, cerebras, ...; per-layer: adaptive, te_delayed": the global policies, then the per-layer ones.
std::string known_policies() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::string global, per_layer;
  for (const auto& [name, entry] : r.factories) {
    std::string& out = entry.kind == ScalerKind::global ? global : per_layer;
    out += (out.empty() ? "" : ", ") + name;
  }
  return per_layer.empty() ? global : global + "; per-layer: " + per_layer;
}

bool is_policy_name(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

void register_scaler(const std::string& policy, ScalerFactory factory, ScalerKind kind) {
  GS_CHECK(is_policy_name(policy), "scaler policy names are [a-z0-9_]+, got '" << policy << "'");
  GS_CHECK(factory != nullptr, "no factory given for scaler policy '" << policy << "'");
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const bool added = r.factories.emplace(policy, Registry::Entry{std::move(factory), kind}).second;
  GS_CHECK(added, "scaler policy '" << policy << "' is already registered");
}

std::vector<std::string> scaler_policies() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.factories) names.push_back(entry.first);
  return names;
}

std::unique_ptr<Scaler> make_scaler(const nlohmann::json& config, Format format) {
  GS_CHECK_CONFIG(config.is_object(), "a scaler configuration is a JSON object {\"policy\": NAME, ...}, got "
                                          << json_excerpt(config));
  GS_CHECK_CONFIG(config.contains("policy"), "scaler configuration "
                                                 << json_excerpt(config)
                                                 << " has no \"policy\" (known: " << known_policies() << ")");
  const nlohmann::json& policy = config.at("policy");
  GS_CHECK_CONFIG(policy.is_string(), "scaler \"policy\" must be a string (known: "
                                          << known_policies() << "), got " << json_excerpt(policy));
  const std::string name = policy.get<std::string>();
  ScalerFactory factory;
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second.factory;
  }
  GS_CHECK_CONFIG(factory != nullptr,
                  "unknown scaler policy '" << text_excerpt(name) << "' (known: " << known_policies() << ")");
  std::unique_ptr<Scaler> scaler = factory(config, format);
  GS_CHECK(scaler != nullptr, "the factory of scaler policy '" << name << "' returned no scaler");
  return scaler;
}

std::unique_ptr<Scaler> make_scaler(std::string_view spec, Format format) {
  return make_scaler(parse_scaler_spec(spec), format);
}

nlohmann::json parse_scaler_spec(std::string_view spec) {
  const std::string_view s = trim(spec);
  GS_CHECK_CONFIG(!s.empty(),
                  "empty scaler spec (expected a JSON object {\"policy\": NAME, ...}, a policy name "
                  "such as torch, or static:S)");
  if (s.front() == '{' || s.front() == '[' || s.front() == '"') {
    const nlohmann::json config = parse_json(s, "scaler spec", JsonSource::config);
    GS_CHECK_CONFIG(config.is_object(), "a scaler spec in JSON is an object {\"policy\": NAME, ...}, got "
                                            << json_excerpt(config));
    return config;
  }
  const std::size_t colon = s.find(':');
  if (colon != std::string_view::npos) {
    const std::string_view head = s.substr(0, colon);
    const std::string value(s.substr(colon + 1));
    GS_CHECK_CONFIG(
        head == "static", "scaler spec '"
                              << text_excerpt(s)
                              << "': only static takes a value after ':' (give other "
                                 "parameters as JSON, e.g. {\"policy\":\"torch\",\"init_scale\":1024})");
    char* end = nullptr;
    const double scale = std::strtod(value.c_str(), &end);
    GS_CHECK_CONFIG(!value.empty() && end == value.c_str() + value.size() && std::isfinite(scale),
                    "scaler spec '" << text_excerpt(s) << "': '" << text_excerpt(value)
                                    << "' is not a finite number (static:S, e.g. static:1024)");
    return {{"policy", "static"}, {"scale", scale}};
  }
  GS_CHECK_CONFIG(is_policy_name(s), "scaler spec '" << text_excerpt(s)
                                                     << "' is not a JSON object, a policy name or static:S "
                                                        "(known policies: "
                                                     << known_policies() << ")");
  const std::string name(s);
  const std::vector<std::string> known = scaler_policies();
  GS_CHECK_CONFIG(std::binary_search(known.begin(), known.end(), name),
                  "unknown scaler policy '" << text_excerpt(name) << "' (known: " << known_policies() << ")");
  return {{"policy", name}};
}

}  // namespace gradscale
