// The adaptive policy's recipe (SPEC §6.1–§6.5; docs/scalers.md, "adaptive"): every key the policy
// takes, parsed from JSON and written back in one place, and the rule each layer decides by — the
// policy's method and keys, or its override's ({"layers": {name: ...}}).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adaptive/method.h"
#include "lib/numeric/format.h"
#include "lib/scaler/scale_rule.h"

namespace gradscale::adaptive {

// {"policy": "adaptive", ...}; defaults are the reference's (SPEC §6.1) and ours (§6.3–§6.5).
struct AdaptiveConfig {
  std::string method = "approx_range";     // approx_range | abs_range | element_wise | fixed | measured
  double n_uf = 1e-3;                      // target fraction of underflowing values, (0, 0.5)
  double scale_upper_bound = 16;           // s ≤ this
  double accum_upper_bound = 1024;         // s ≤ this / S_in
  bool derived_bounds = false;             // "bounds": "derived" (SPEC §6.6: adaptive/derived_bounds.h) instead
                                           // of "reference" (the two constants above)
  bool power_of_two = true;                // s = 2^floor(log2 s)
  std::int64_t update_every = 1;           // statistics recomputed every N steps per layer
  double relu_factor = 0.5;                // approx_range: fraction of non-zero products, (0, 1]
  bool auto_init = false;                  // init_scale "auto": S0 chosen every step from the loss gradient
  double init_scale = 1;                   // S0 before φ (when not auto)
  std::string cast_form = "no_weight";     // how "auto" chooses S0: no_weight | lognormal | measured
  std::int64_t recover_every = 50;         // clean steps before a safety factor doubles back (≤ 1)
  double fixed_scale = 1;                  // fixed: the local scale
  int margin = 4;                          // measured: bits of headroom below u_max, [0, 64]
  std::optional<double> u_min, u_max;      // unset: the gradient format's min subnormal, max finite
  bool control_all = false;                // "control_at": "all" — every layer that sends a gradient upstream
  std::string controller;                  // a registered LayerController instead of `method` (empty: none)
  nlohmann::json controller_config = nlohmann::json::object();
  nlohmann::json layers = nlohmann::json::object();  // overrides: layer name -> "global" | {kLayerKeys}
};

// The keys of the per-layer method, which a configuration with "controller" does not take.
extern const std::vector<std::string> kMethodKeys;
// The keys a layer's override may give: its method and what the method and the bounds read. The
// loss-level keys (init_scale, cast_form, recover_every, u_min, u_max) are the policy's.
extern const std::vector<std::string> kLayerKeys;

// The configuration from JSON: ConfigError naming the key, the allowed values and what was found; the
// scales checked against float32's range and u_min/u_max against `format` (the gradient format).
// Every override in "layers" is checked too (its layer names only when the policy is bound).
AdaptiveConfig parse_adaptive_config(const nlohmann::json& config, Format format);
// The configuration as the policy reports it (Scaler::config, the trace header, state dicts): every
// key of the method, or the loss-level keys alone with a controller; "control_at" and "layers" only
// when not their defaults. parse_adaptive_config(adaptive_config_json(c)) == c.
nlohmann::json adaptive_config_json(const AdaptiveConfig& c);

// How one layer decides: a method with its parameters and bounds, recomputed every `update_every`
// steps; `global`: it sends its gradient at s = 1 (the global scale), with no statistics and no φ_l.
struct LayerRule {
  bool global = false;
  std::string method_name;
  std::shared_ptr<const Method> method;
  MethodParams params;
  ScaleBounds bounds;
  std::int64_t update_every = 1;
};

// The rule of the policy's own keys, for gradient format `format`.
LayerRule default_layer_rule(const AdaptiveConfig& c, Format format);
// The rule of the override `value` ("global" or an object of kLayerKeys) of layer `name`: what it does
// not give is the policy's. ConfigError naming the layer and the key.
LayerRule override_layer_rule(const AdaptiveConfig& c, const std::string& name, const nlohmann::json& value,
                              Format format);

}  // namespace gradscale::adaptive
