// Policy `adaptive` (see adaptive_scaler.h): the shared machinery around the methods.
#include "adaptive/adaptive_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "adaptive/local_safety.h"
#include "adaptive/math.h"
#include "adaptive/method.h"
#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/optim/config_reader.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::adaptive {
namespace {

using optim_detail::ConfigReader;
using optim_detail::Interval;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct AdaptiveConfig {
  std::string method = "approx_range";
  double n_uf = 1e-3;
  double scale_upper_bound = 16, accum_upper_bound = 1024;
  bool power_of_two = true;
  std::int64_t update_every = 1;
  double relu_factor = 0.5;
  bool auto_init = false;
  double init_scale = 1;
  std::string cast_form = "no_weight";
  std::int64_t recover_every = 50;
  double fixed_scale = 1;
  int margin = 4;
  std::optional<double> u_min, u_max;  // unset: the gradient format's
  bool control_all = false;  // "control_at": "all" — every layer sends its gradient at a local scale
  // A registered LayerController that decides the local scales instead of `method` (empty: none).
  std::string controller;
  nlohmann::json controller_config = nlohmann::json::object();
  // Per-layer overrides ("layers"): layer name -> "global" or an object of kLayerKeys (validated).
  nlohmann::json layers = nlohmann::json::object();
};

// The keys a layer's override may give ({"layers": {"head": {"n_uf": 1e-4}}}): its method and what the
// method and the bounds read. The loss-level keys (init_scale, cast_form, recover_every, u_min, u_max)
// are the policy's.
const char* const kLayerKeys[] = {"method", "n_uf", "scale_upper_bound", "accum_upper_bound", "power_of_two",
                                  "update_every", "relu_factor", "fixed_scale", "margin"};

// How one layer decides: the policy's method and keys, or its override's; `global`: it sends its
// gradient at s = 1 (the global scale), with no statistics and no φ_l.
struct LayerRule {
  bool global = false;
  std::string method_name;
  std::shared_ptr<const Method> method;
  MethodParams params;
  ScaleBounds bounds;
  std::int64_t update_every = 1;
};

// The keys of the per-layer method, which a configuration with "controller" does not take.
const char* const kMethodKeys[] = {"method",       "scale_upper_bound", "accum_upper_bound", "power_of_two",
                                   "update_every", "relu_factor",       "fixed_scale"};

// The cached decision of one layer (update_every).
struct LayerCache {
  std::int64_t computed_at = -1;  // step of the last recomputation, -1 = never
  double unbound = 1;
};

class AdaptiveScaler final : public Scaler, public LayerController {
 public:
  AdaptiveScaler(AdaptiveConfig c, Format format) : c_(std::move(c)), method_(make_method(c_.method)) {
    format_ = format;
    set_format(format);
    if (!c_.controller.empty()) user_ = make_controller(c_.controller, c_.controller_config, format);
  }

  // ---- loss-level policy ----
  std::string policy() const override { return "adaptive"; }
  double loss_scale() const override {
    return c_.auto_init ? last_loss_scale_ : std::max(phi() * c_.init_scale, loss_floor_);
  }
  // A registered controller (c_.controller) decides the local scales itself: it gets φ in begin_step,
  // and the per-layer factors φ_l of SPEC §6.5 are the built-in methods'.
  LayerController* layer_controller() override { return user_ ? user_.get() : this; }
  double phi() const override { return safety_.loss_factor(); }
  void begin_step(std::int64_t step) override {
    if (user_)
      user_->begin_step(StepBegin{step, phi()});
    else
      begin_step(StepBegin{step, phi()});
  }
  StatNeeds loss_needs() const override {
    // The S0 floor (SPEC §6.5) reads the exact loss gradient's binades every step.
    if (!c_.auto_init || c_.cast_form == "measured") return kNeedUpstreamStats;
    return kNeedUpstreamStats | (c_.cast_form == "lognormal" ? kNeedGradLogMoments | kNeedGradMoments : kNeedGradMoments);
  }
  double choose_loss_scale(const LocalScaleQuery& g) override {
    // The floor: the smallest power of two at which at most n_uf of the loss gradient's non-zero values
    // underflow, capped so its largest stay under u_max·2^-margin — SPEC §6.3's rule on the exact gradient.
    // A query without the statistics it asked for (an engine of one's own) gets no floor.
    const double rule = g.upstream_stats ? cast_measured_->unbound_scale(g, params_) : 0.0;
    loss_floor_ = std::isfinite(rule) && rule > 0 ? power_of_two_floor(rule) : 0.0;
    double s = loss_floor_;
    if (c_.auto_init && c_.cast_form == "measured") {
      GS_CHECK(g.upstream_stats, "adaptive: the loss query lacks the statistics it asked for");
    } else if (c_.auto_init) {
      GS_CHECK(g.grad_moments, "adaptive: the loss query lacks the moments it asked for");
      s = power_of_two_floor(c_.cast_form == "lognormal"
                                 ? approx_range_lognormal(*g.grad_log_moments, g.grad_moments->max_abs, params_)
                                 : approx_range_no_weight(*g.grad_moments, params_));
    } else {
      s = c_.init_scale;
    }
    last_loss_scale_ = std::max(phi() * s, loss_floor_);
    return last_loss_scale_;
  }

  StepReport update(const StepStatistics& stats) override {
    // SPEC §6.5: overflows charged where they happened (the layers' φ_l, the loss scale's φ), sized
    // back-offs, recovery after recover_every clean steps; the step is skipped only when a value the
    // update would use is not finite. Without the step's records (replay): §6.4's global halving.
    bool skip = stats.found_inf;
    if (user_) {  // a registered controller: SPEC §6.4 as before (it sees φ; φ_l are the methods')
      if (stats.found_inf)
        safety_.charge_loss_halving(c_.recover_every);
      else
        safety_.update(StepMonitor{}, params_.u_max, c_.margin, c_.recover_every);
    } else if (stats.monitor != nullptr) {
      safety_.update(*stats.monitor, params_.u_max, c_.margin, c_.recover_every);
      skip = stats.monitor->nonfinite_stored;
    } else if (stats.found_inf) {
      safety_.charge_loss_halving(c_.recover_every);
    } else {
      safety_.update(StepMonitor{}, params_.u_max, c_.margin, c_.recover_every);
    }
    return {skip, loss_scale(), state()};
  }

  // ---- per-layer controller ----
  void bind(const std::vector<LayerInfo>& layers, Format grad_format) override {
    set_format(grad_format);
    bind_rules(layers);
    cache_.assign(layers.size(), LayerCache{});
    safety_.bind(layers, c_.control_all);
    if (user_) user_->bind(layers, grad_format);
  }
  void begin_step(const StepBegin& b) override { step_ = b.step; }
  StatNeeds needs(int layer_id) const override {
    const LayerRule& r = rule(layer_id);
    return !r.global && due(layer_id) ? r.method->needs() : 0;
  }
  bool acts_at(int /*layer_id*/) const override { return c_.control_all; }
  LocalScale decide(const LocalScaleQuery& q) override {
    const LayerRule& r = rule(q.layer_id);
    if (r.global) return {1.0, 1.0};
    LayerCache& entry = cache_at(q.layer_id);
    if (due(q.layer_id)) {
      entry.unbound = r.method->unbound_scale(q, r.params);
      entry.computed_at = step_;
    }
    // SPEC §6.1 bounds, for every method; then a power of two so that scaling is exact; then φ_l
    // (SPEC §6.5), which may take s below 1.
    return {bounded_scale(entry.unbound, q.scale_in, r.bounds) * safety_.layer_factor(q.layer_id), entry.unbound};
  }
  bool scales_weight_grads() const override { return true; }
  double weight_grad_scale(const WeightGradQuery& q) override {
    return weight_grad_range_scale(q.max_abs, params_.u_max, q.scale_in);
  }
  std::optional<double> device_weight_grad_bound(int /*layer_id*/) const override { return params_.u_max; }
  void accept(int layer_id, const LocalScale& decision) override {
    LayerCache& entry = cache_at(layer_id);
    if (due(layer_id)) {
      entry.unbound = decision.unbound;
      entry.computed_at = step_;
    }
  }
  void end_step(const StepMonitor& /*monitor*/) override {}  // the safety factors are updated in update()
  std::optional<ScaleRule> device_rule(int layer_id) const override {
    const LayerRule& lr = rule(layer_id);
    ScaleRule r;
    r.params = lr.params;
    r.bounds = lr.bounds;
    r.factor = safety_.layer_factor(layer_id);
    if (lr.global) {  // s = 1 exactly: fixed at 1, unbounded, no φ_l
      r.formula = ScaleRule::kFixed;
      r.params.fixed_scale = 1;
      r.bounds = ScaleBounds{kInf, kInf, true};
      r.factor = 1;
      return r;
    }
    if (!due(layer_id)) {
      r.formula = ScaleRule::kKept;
      r.kept = const_cast<AdaptiveScaler*>(this)->cache_at(layer_id).unbound;
      return r;
    }
    if (lr.method_name == "approx_range") r.formula = ScaleRule::kApproxRange;
    else if (lr.method_name == "abs_range") r.formula = ScaleRule::kAbsRange;
    else if (lr.method_name == "measured") r.formula = ScaleRule::kMeasured;
    else if (lr.method_name == "fixed") r.formula = ScaleRule::kFixed;
    else return std::nullopt;  // element_wise streams every partial product: the host decides
    return r;  // the backend fills in K (`reduction`) from the layer
  }

  nlohmann::json config() const override {
    if (user_) {  // the loss-level keys only: the controller owns the per-layer decision
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
                        {"scale_upper_bound", c_.scale_upper_bound},
                        {"accum_upper_bound", c_.accum_upper_bound},
                        {"power_of_two", c_.power_of_two},
                        {"update_every", c_.update_every},
                        {"relu_factor", c_.relu_factor},
                        {"cast_form", c_.cast_form},
                        {"recover_every", c_.recover_every},
                        {"fixed_scale", c_.fixed_scale},
                        {"margin", c_.margin}};
    j["init_scale"] = c_.auto_init ? nlohmann::json("auto") : nlohmann::json(c_.init_scale);
    if (c_.u_min) j["u_min"] = *c_.u_min;
    if (c_.u_max) j["u_max"] = *c_.u_max;
    if (c_.control_all) j["control_at"] = "all";  // the default "gemm" is left out: configs stay as they were
    if (!c_.layers.empty()) j["layers"] = c_.layers;
    return j;
  }

  nlohmann::json state() const override {
    nlohmann::json layers = nlohmann::json::array();
    for (std::size_t i = 0; i < cache_.size(); ++i) {
      const nlohmann::json safety = safety_.layer_state(static_cast<int>(i));
      if (cache_[i].computed_at < 0 && safety.is_null()) continue;
      nlohmann::json l = {{"id", i}, {"computed_at", cache_[i].computed_at}, {"unbound", cache_[i].unbound}};
      if (!safety.is_null()) l.update(safety);
      layers.push_back(std::move(l));
    }
    nlohmann::json j = safety_.loss_state();
    j["last_loss_scale"] = last_loss_scale_;
    j["loss_floor"] = loss_floor_;
    j["layers"] = layers;
    if (user_) j["controller"] = user_->controller_state();
    return j;
  }

  void restore_state(const nlohmann::json& state) override {
    const char* const where = "scaler 'adaptive' state";
    const ConfigReader r(state, where, {"phi", "clean_steps", "last_loss_scale", "loss_floor", "layers", "controller"});
    GS_CHECK_CONFIG(r.has("controller") == (user_ != nullptr),
                    "scaler 'adaptive' state: " << (user_ ? "no 'controller' state for controller '" + c_.controller + "'"
                                                          : std::string("a 'controller' state, but this policy runs "
                                                                        "method '") + c_.method + "'"));
    const auto read_phi = [&](const ConfigReader& reader, const std::string& what) {
      const double phi = reader.number("phi", 1.0, Interval{0, 1, true, false});
      GS_CHECK_CONFIG(power_of_two_floor(phi) == phi, what << ": 'phi' must be a power of two, got " << phi);
      return phi;
    };
    GS_CHECK_CONFIG(r.has("phi"), where << ": missing key 'phi'");
    const double phi = read_phi(r, where);
    const std::int64_t clean = r.required_integer("clean_steps", 0, c_.recover_every - 1);
    const double last = r.required_number("last_loss_scale", Interval{0, kInf, false, true});
    const double floor = r.number("loss_floor", 0.0, Interval{0, kInf, false, true});  // absent before round 3
    const nlohmann::json& layers = state.at("layers");
    GS_CHECK_CONFIG(layers.is_array(), "scaler 'adaptive' state: 'layers' must be an array");
    std::vector<LayerCache> cache(cache_.size());
    LocalSafety safety = safety_;
    safety.clear_layers();
    for (const nlohmann::json& l : layers) {
      const std::string entry = std::string(where) + ": a 'layers' entry";
      const ConfigReader lr(l, entry, {"id", "computed_at", "unbound", "phi", "clean_steps"});
      const std::int64_t id = lr.required_integer("id", 0, static_cast<std::int64_t>(cache.size()) - 1);
      LayerCache& c = cache[static_cast<std::size_t>(id)];
      c.computed_at = lr.required_integer("computed_at", -1, std::numeric_limits<std::int64_t>::max());
      c.unbound = lr.required_number("unbound", Interval{0, kInf, true, true});
      safety.restore_layer(static_cast<int>(id), read_phi(lr, entry),
                           lr.integer("clean_steps", 0, 0, c_.recover_every - 1));
    }
    if (user_) user_->restore_controller_state(state.at("controller"));
    safety.restore_loss(phi, clean);
    safety_ = std::move(safety);
    last_loss_scale_ = last;
    loss_floor_ = floor;
    cache_ = std::move(cache);
  }

 private:
  void set_format(Format f) {
    const FormatInfo& info = format_info(f);
    params_.n_uf = c_.n_uf;
    params_.c = underflow_coefficient(c_.n_uf);
    params_.u_min = c_.u_min.value_or(info.min_subnormal);
    params_.u_max = c_.u_max.value_or(info.max_finite);
    params_.relu_factor = c_.relu_factor;
    params_.fixed_scale = c_.fixed_scale;
    params_.margin = c_.margin;
    bounds_ = ScaleBounds{c_.scale_upper_bound, c_.accum_upper_bound, c_.power_of_two};
    default_rule_ = LayerRule{false, c_.method, method_, params_, bounds_, c_.update_every};
    format_ = f;
  }

  // Each layer's rule: the policy's, or its override's (resolved by layer name). ConfigError for an
  // override naming no layer of the table.
  void bind_rules(const std::vector<LayerInfo>& layers) {
    rules_.assign(layers.size(), default_rule_);
    for (const auto& [name, value] : c_.layers.items()) {
      bool found = false;
      for (std::size_t i = 0; i < layers.size(); ++i) {
        if (layers[i].name != name) continue;
        rules_[i] = override_rule(name, value, format_);
        found = true;
      }
      if (!found) {
        std::string known;
        for (const LayerInfo& l : layers) known += (known.empty() ? "" : ", ") + l.name;
        throw ConfigError("scaler 'adaptive': 'layers' names '" + name + "', which is no layer of the model (its "
                          "layers: " + known + ")");
      }
    }
  }

 public:
  // The rule of an override (c_ gives what it does not): validated here, so a bad override fails when
  // the policy is made.
  LayerRule override_rule(const std::string& name, const nlohmann::json& value, Format f) const {
    const std::string where = "scaler 'adaptive': 'layers': '" + name + "'";
    if (value.is_string()) {
      GS_CHECK_CONFIG(value == "global", where << " must be \"global\" or an object of per-layer keys, got "
                                               << json_excerpt(value));
      LayerRule r = default_rule_;
      r.global = true;
      return r;
    }
    GS_CHECK_CONFIG(value.is_object(), where << " must be \"global\" or an object of per-layer keys, got "
                                             << json_excerpt(value));
    const ConfigReader r(value, where, std::vector<std::string>(std::begin(kLayerKeys), std::end(kLayerKeys)));
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
    rule.bounds.scale_upper_bound = r.number("scale_upper_bound", c_.scale_upper_bound, Interval{0, kInf, true, true});
    rule.bounds.accum_upper_bound = r.number("accum_upper_bound", c_.accum_upper_bound, Interval{0, kInf, true, true});
    rule.bounds.power_of_two = r.boolean("power_of_two", c_.power_of_two);
    rule.update_every = r.integer("update_every", c_.update_every, 1, std::int64_t{1} << 40);
    check_scale_range("adaptive", "scale_upper_bound", rule.bounds.scale_upper_bound);
    check_scale_range("adaptive", "accum_upper_bound", rule.bounds.accum_upper_bound);
    check_scale_range("adaptive", "fixed_scale", p.fixed_scale);
    return rule;
  }

 private:
  const LayerRule& rule(int layer_id) const {
    return layer_id >= 0 && static_cast<std::size_t>(layer_id) < rules_.size() ? rules_[static_cast<std::size_t>(layer_id)]
                                                                               : default_rule_;
  }

  bool due(int layer_id) const {
    const LayerCache& e = const_cast<AdaptiveScaler*>(this)->cache_at(layer_id);
    return e.computed_at < 0 || step_ - e.computed_at >= rule(layer_id).update_every;
  }
  LayerCache& cache_at(int layer_id) {
    // A controller used without bind() (a single layer in a test) grows its table on demand.
    GS_CHECK(layer_id >= 0, "adaptive: local scale asked for layer id " << layer_id);
    if (static_cast<std::size_t>(layer_id) >= cache_.size()) cache_.resize(static_cast<std::size_t>(layer_id) + 1);
    return cache_[static_cast<std::size_t>(layer_id)];
  }

  AdaptiveConfig c_;
  std::shared_ptr<const Method> method_;
  Format format_;
  LayerRule default_rule_;        // the policy's own keys
  std::vector<LayerRule> rules_;  // per layer (bind); default_rule_ for a layer outside the table
  std::unique_ptr<LayerController> user_;  // c_.controller's, when configured
  std::unique_ptr<Method> cast_measured_ = make_measured();  // cast_form "measured" at the loss
  MethodParams params_;
  ScaleBounds bounds_;
  std::vector<LayerCache> cache_;
  std::int64_t step_ = 0;
  LocalSafety safety_;          // φ of the loss scale and φ_l per layer (SPEC §6.5)
  double last_loss_scale_ = 1;  // S0 of the last iteration
  double loss_floor_ = 0;       // its floor (SPEC §6.5): 0 before the first iteration
};

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

const std::vector<std::string>& method_names() {
  static const std::vector<std::string> names = {"approx_range", "abs_range", "element_wise", "fixed",
                                                 "measured"};
  return names;
}

std::unique_ptr<Method> make_method(const std::string& name) {
  if (name == "approx_range") return make_approx_range();
  if (name == "abs_range") return make_abs_range();
  if (name == "element_wise") return make_element_wise();
  if (name == "fixed") return make_fixed();
  if (name == "measured") return make_measured();
  std::string known;
  for (const auto& n : method_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("scaler 'adaptive': unknown method '" + name + "' (allowed: " + known + ")");
}

std::unique_ptr<Scaler> make_adaptive_scaler(const nlohmann::json& config, Format format) {
  const ConfigReader r(config, "scaler 'adaptive'",
                       {"policy", "method", "n_uf", "scale_upper_bound", "accum_upper_bound", "power_of_two",
                        "update_every", "relu_factor", "init_scale", "cast_form", "recover_every", "fixed_scale",
                        "margin", "u_min", "u_max", "controller", "controller_config", "control_at", "layers"});
  AdaptiveConfig c;
  if (r.has("controller")) {
    const nlohmann::json& name = config.at("controller");
    GS_CHECK_CONFIG(name.is_string() && !name.get<std::string>().empty(),
                    "scaler 'adaptive': 'controller' must be the name of a registered controller, got "
                        << json_excerpt(name));
    c.controller = name.get<std::string>();
    for (const char* key : kMethodKeys)
      GS_CHECK_CONFIG(!r.has(key), "scaler 'adaptive': '" << key << "' belongs to the built-in methods and is not "
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
  auto scaler = std::make_unique<AdaptiveScaler>(std::move(c), format);
  if (config.contains("layers"))
    for (const auto& [name, value] : config.at("layers").items())
      scaler->override_rule(name, value, format);  // each override's keys checked now, not at bind
  return scaler;
}

}  // namespace gradscale::adaptive
