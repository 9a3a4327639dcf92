// The adaptive policy's recipe (see adaptive_config.h): parsing, writing back, and each layer's rule.
#include "adaptive/adaptive_config.h"

#include <cmath>
#include <limits>

#include "adaptive/math.h"
#include "lib/core/config_reader.h"
#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::adaptive {

const std::vector<std::string> kMethodKeys = {"method",       "scale_upper_bound", "accum_upper_bound", "bounds",
                                              "power_of_two", "update_every",      "relu_factor",       "fixed_scale"};
const std::vector<std::string> kLayerKeys = {"method",       "n_uf",        "scale_upper_bound", "accum_upper_bound",
                                             "power_of_two", "update_every", "relu_factor",      "fixed_scale",
                                             "margin"};

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The scales and bounds in float32's range (scale_range.h), and a u_min or u_max given alone checked
// against the default of the other: the gradient format's smallest subnormal and largest finite value.
void check_adaptive_ranges(const AdaptiveConfig& c, Format format) {
  check_scale_range("adaptive", "scale_upper_bound", c.scale_upper_bound);
  check_scale_range("adaptive", "accum_upper_bound", c.accum_upper_bound);
  check_scale_range("adaptive", "fixed_scale", c.fixed_scale);
  if (!c.auto_init) check_scale_range("adaptive", "init_scale", c.init_scale);
  const FormatInfo& info = format_info(format);
  if (c.u_max && !c.u_min)
    GS_CHECK_CONFIG(*c.u_max > info.min_subnormal,
                    "scaler 'adaptive': 'u_max' (" << *c.u_max << ") must be above 'u_min', which is "
                                                   << info.min_subnormal << " (the smallest subnormal of "
                                                   << format_name(format) << ") when not given");
  if (c.u_min && !c.u_max)
    GS_CHECK_CONFIG(*c.u_min < info.max_finite,
                    "scaler 'adaptive': 'u_min' (" << *c.u_min << ") must be below 'u_max', which is "
                                                   << info.max_finite << " (the largest finite value of "
                                                   << format_name(format) << ") when not given");
}

}  // namespace

AdaptiveConfig parse_adaptive_config(const nlohmann::json& config, Format format) {
  const ConfigReader r(config, "scaler 'adaptive'",
                       {"policy", "method", "n_uf", "scale_upper_bound", "accum_upper_bound", "power_of_two",
                        "update_every", "relu_factor", "init_scale", "cast_form", "recover_every", "fixed_scale",
                        "margin", "u_min", "u_max", "controller", "controller_config", "control_at", "layers",
                        "bounds"});
  AdaptiveConfig c;
  if (r.has("controller")) {
    const nlohmann::json& name = config.at("controller");
    GS_CHECK_CONFIG(name.is_string() && !name.get<std::string>().empty(),
                    "scaler 'adaptive': 'controller' must be the name of a registered controller, got "
                        << json_excerpt(name));
    c.controller = name.get<std::string>();
    for (const std::string& key : kMethodKeys)
      GS_CHECK_CONFIG(!r.has(key.c_str()), "scaler 'adaptive': '" << key << "' belongs to the built-in methods and is not "
                                                          << "taken with 'controller' ('" << c.controller
                                                          << "' decides the local scales; its own keys go in "
                                                          << "'controller_config')");
    if (r.has("controller_config")) {
      c.controller_config = config.at("controller_config");
      GS_CHECK_CONFIG(c.controller_config.is_object(), "scaler 'adaptive': 'controller_config' must be an object, got "
                                                           << json_excerpt(c.controller_config));
    }
  } else {
    GS_CHECK_CONFIG(!r.has("controller_config"),
                    "scaler 'adaptive': 'controller_config' is given without 'controller'");
  }
  if (r.has("method")) {
    GS_CHECK_CONFIG(config.at("method").is_string(), "scaler 'adaptive': 'method' must be a string, got "
                                                         << json_excerpt(config.at("method")));
    c.method = config.at("method").get<std::string>();
  }
  make_method(c.method);  // validates the name
  if (r.has("control_at")) {
    const nlohmann::json& at = config.at("control_at");
    GS_CHECK_CONFIG(at == "gemm" || at == "all", "scaler 'adaptive': 'control_at' must be \"gemm\" (Linear and "
                                                 "Conv2d, the default) or \"all\" (every layer that sends a "
                                                 "gradient upstream), got " << json_excerpt(at));
    c.control_all = at == "all";
    GS_CHECK_CONFIG(!c.control_all || c.controller.empty(),
                    "scaler 'adaptive': 'control_at' is not taken with 'controller' ('"
                        << c.controller << "' says where it acts: LayerController::acts_at)");
    GS_CHECK_CONFIG(!c.control_all || c.method == "measured" || c.method == "fixed",
                    "scaler 'adaptive': 'control_at': \"all\" needs a method that decides without a weight "
                    "(measured or fixed); '" << c.method << "' reads the layer's weight, which BatchNorm, "
                    "pooling, ReLU, Flatten, Dropout and Add do not have");
  }
  if (r.has("bounds")) {
    const nlohmann::json& b = config.at("bounds");
    GS_CHECK_CONFIG(b == "reference" || b == "derived",
                    "scaler 'adaptive': 'bounds' must be \"reference\" (the constants scale_upper_bound and "
                    "accum_upper_bound, the paper's) or \"derived\" (from the magnitudes measured downstream), got "
                        << json_excerpt(b));
    c.derived_bounds = b == "derived";
    for (const char* key : {"scale_upper_bound", "accum_upper_bound"})
      GS_CHECK_CONFIG(!c.derived_bounds || !r.has(key),
                      "scaler 'adaptive': '" << key << "' is a constant of \"bounds\": \"reference\"; "
                                             << "\"bounds\": \"derived\" takes no constant bound");
  }
  c.n_uf = r.number("n_uf", c.n_uf, Interval{0, 0.5, true, true});
  c.scale_upper_bound = r.number("scale_upper_bound", c.scale_upper_bound, Interval{0, kInf, true, true});
  c.accum_upper_bound = r.number("accum_upper_bound", c.accum_upper_bound, Interval{0, kInf, true, true});
  c.power_of_two = r.boolean("power_of_two", c.power_of_two);
  c.update_every = r.integer("update_every", c.update_every, 1, std::int64_t{1} << 40);
  c.relu_factor = r.number("relu_factor", c.relu_factor, Interval{0, 1, true, false});
  if (r.has("init_scale") && config.at("init_scale").is_string()) {
    GS_CHECK_CONFIG(config.at("init_scale") == "auto", "scaler 'adaptive': 'init_scale' must be a number > 0 or \"auto\", got "
                                                           << json_excerpt(config.at("init_scale")));
    c.auto_init = true;
  } else {
    c.init_scale = r.number("init_scale", c.init_scale, Interval{0, kInf, true, true});
  }
  if (r.has("cast_form")) {
    const nlohmann::json& f = config.at("cast_form");
    GS_CHECK_CONFIG(f == "no_weight" || f == "lognormal" || f == "measured",
                    "scaler 'adaptive': 'cast_form' must be \"no_weight\", \"lognormal\" or \"measured\", got "
                        << json_excerpt(f));
    c.cast_form = f.get<std::string>();
  }
  c.recover_every = r.integer("recover_every", c.recover_every, 1, std::int64_t{1} << 40);
  c.fixed_scale = r.number("fixed_scale", c.fixed_scale, Interval{0, kInf, true, true});
  c.margin = static_cast<int>(r.integer("margin", c.margin, 0, 64));
  if (r.has("u_min")) c.u_min = r.number("u_min", 0, Interval{0, kInf, true, true});
  if (r.has("u_max")) c.u_max = r.number("u_max", 0, Interval{0, kInf, true, true});
  if (c.u_min && c.u_max)
    GS_CHECK_CONFIG(*c.u_min < *c.u_max, "scaler 'adaptive': 'u_min' (" << *c.u_min << ") must be below 'u_max' ("
                                                                         << *c.u_max << ")");
  check_adaptive_ranges(c, format);
  if (r.has("layers")) {
    const nlohmann::json& layers = config.at("layers");
    GS_CHECK_CONFIG(layers.is_object(), "scaler 'adaptive': 'layers' must be an object {layer name: \"global\" or "
                                        "{per-layer keys}}, got " << json_excerpt(layers));
    GS_CHECK_CONFIG(c.controller.empty() || layers.empty(),
                    "scaler 'adaptive': 'layers' is not taken with 'controller' ('" << c.controller
                                                                                   << "' decides every layer)");
    c.layers = layers;
  }
  for (const auto& [name, value] : c.layers.items())
    override_layer_rule(c, name, value, format);  // each override's keys checked now, its name at bind
  return c;
}


nlohmann::json adaptive_config_json(const AdaptiveConfig& c_) {
  if (!c_.controller.empty()) {  // the loss-level keys only: the controller owns the per-layer decision
    nlohmann::json j = {{"policy", "adaptive"},         {"controller", c_.controller},
                        {"controller_config", c_.controller_config}, {"n_uf", c_.n_uf},
                        {"cast_form", c_.cast_form},     {"recover_every", c_.recover_every},
                        {"margin", c_.margin}};
    j["init_scale"] = c_.auto_init ? nlohmann::json("auto") : nlohmann::json(c_.init_scale);
    if (c_.u_min) j["u_min"] = *c_.u_min;
    if (c_.u_max) j["u_max"] = *c_.u_max;
    return j;
  }
  nlohmann::json j = {{"policy", "adaptive"},
                      {"method", c_.method},
                      {"n_uf", c_.n_uf},
                      {"power_of_two", c_.power_of_two},
                      {"update_every", c_.update_every},
                      {"relu_factor", c_.relu_factor},
                      {"cast_form", c_.cast_form},
                      {"recover_every", c_.recover_every},
                      {"fixed_scale", c_.fixed_scale},
                      {"margin", c_.margin}};
  j["init_scale"] = c_.auto_init ? nlohmann::json("auto") : nlohmann::json(c_.init_scale);
  if (c_.derived_bounds) {
    j["bounds"] = "derived";  // "reference", the default, is left out: configs stay as they were
  } else {
    j["scale_upper_bound"] = c_.scale_upper_bound;
    j["accum_upper_bound"] = c_.accum_upper_bound;
  }
  if (c_.u_min) j["u_min"] = *c_.u_min;
  if (c_.u_max) j["u_max"] = *c_.u_max;
  if (c_.control_all) j["control_at"] = "all";  // the default "gemm" is left out: configs stay as they were
  if (!c_.layers.empty()) j["layers"] = c_.layers;
  return j;
}

LayerRule default_layer_rule(const AdaptiveConfig& c, Format format) {
  const FormatInfo& info = format_info(format);
  LayerRule r;
  r.method_name = c.method;
  r.method = make_method(c.method);
  r.params.n_uf = c.n_uf;
  r.params.c = underflow_coefficient(c.n_uf);
  r.params.u_min = c.u_min.value_or(info.min_subnormal);
  r.params.u_max = c.u_max.value_or(info.max_finite);
  r.params.relu_factor = c.relu_factor;
  r.params.fixed_scale = c.fixed_scale;
  r.params.margin = c.margin;
  r.bounds = c.derived_bounds ? ScaleBounds{kInf, kInf, c.power_of_two}  // B_l is applied per step
                              : ScaleBounds{c.scale_upper_bound, c.accum_upper_bound, c.power_of_two};
  r.update_every = c.update_every;
  return r;
}

LayerRule override_layer_rule(const AdaptiveConfig& c_, const std::string& name, const nlohmann::json& value,
                            Format f) {
  const std::string where = "scaler 'adaptive': 'layers': '" + name + "'";
  if (value.is_string()) {
    GS_CHECK_CONFIG(value == "global", where << " must be \"global\" or an object of per-layer keys, got "
                                             << json_excerpt(value));
    LayerRule r = default_layer_rule(c_, f);
    r.global = true;
    return r;
  }
  GS_CHECK_CONFIG(value.is_object(), where << " must be \"global\" or an object of per-layer keys, got "
                                           << json_excerpt(value));
  const ConfigReader r(value, where, kLayerKeys);
  LayerRule rule;
  rule.method_name = c_.method;
  if (r.has("method")) {
    GS_CHECK_CONFIG(value.at("method").is_string(), where << ": 'method' must be a string, got "
                                                          << json_excerpt(value.at("method")));
    rule.method_name = value.at("method").get<std::string>();
  }
  rule.method = make_method(rule.method_name);
  GS_CHECK_CONFIG(!c_.control_all || rule.method_name == "measured" || rule.method_name == "fixed",
                  where << ": 'control_at': \"all\" needs a method that decides without a weight (measured or "
                        << "fixed), got '" << rule.method_name << "'");
  const FormatInfo& info = format_info(f);
  MethodParams& p = rule.params;
  p.n_uf = r.number("n_uf", c_.n_uf, Interval{0, 0.5, true, true});
  p.c = underflow_coefficient(p.n_uf);
  p.u_min = c_.u_min.value_or(info.min_subnormal);
  p.u_max = c_.u_max.value_or(info.max_finite);
  p.relu_factor = r.number("relu_factor", c_.relu_factor, Interval{0, 1, true, false});
  p.fixed_scale = r.number("fixed_scale", c_.fixed_scale, Interval{0, kInf, true, true});
  p.margin = static_cast<int>(r.integer("margin", c_.margin, 0, 64));
  for (const char* key : {"scale_upper_bound", "accum_upper_bound"})
    GS_CHECK_CONFIG(!c_.derived_bounds || !r.has(key),
                    where << ": '" << key << "' is a constant of \"bounds\": \"reference\"; the policy has "
                          << "\"bounds\": \"derived\"");
  rule.bounds.scale_upper_bound = c_.derived_bounds ? kInf : r.number("scale_upper_bound", c_.scale_upper_bound, Interval{0, kInf, true, true});
  rule.bounds.accum_upper_bound = c_.derived_bounds ? kInf : r.number("accum_upper_bound", c_.accum_upper_bound, Interval{0, kInf, true, true});
  rule.bounds.power_of_two = r.boolean("power_of_two", c_.power_of_two);
  rule.update_every = r.integer("update_every", c_.update_every, 1, std::int64_t{1} << 40);
  if (!c_.derived_bounds) {
    check_scale_range("adaptive", "scale_upper_bound", rule.bounds.scale_upper_bound);
    check_scale_range("adaptive", "accum_upper_bound", rule.bounds.accum_upper_bound);
  }
  check_scale_range("adaptive", "fixed_scale", p.fixed_scale);
  return rule;
}

}  // namespace gradscale::adaptive
