// Policy `adaptive` (see adaptive_scaler.h): the shared machinery around the methods.
#include "adaptive/adaptive_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "adaptive/adaptive_config.h"
#include "adaptive/derived_bounds.h"
#include "adaptive/local_safety.h"
#include "adaptive/math.h"
#include "adaptive/method.h"
#include "lib/core/error.h"
#include "lib/core/config_reader.h"
#include "lib/core/json_read.h"

namespace gradscale::adaptive {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The cached decision of one layer (update_every).
struct LayerCache {
  std::int64_t computed_at = -1;  // step of the last recomputation, -1 = never
  double unbound = 1;
};

class AdaptiveScaler final : public Scaler, public LayerController {
 public:
  AdaptiveScaler(AdaptiveConfig c, Format format) : c_(std::move(c)) {
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
    // A query without the statistics it asked for (an engine of one's own) gets no floor. S0 from it is
    // the rule a device evaluates (device_loss_rule), here on the host's statistics.
    const LossScaleRule rule = loss_rule();
    LossScaleDecision d{rule.base_is_floor ? 0.0 : rule.phi * rule.base, 0.0};
    if (const TensorStats* o = g.upstream_stats)
      d = loss_scale_decision(rule, o->binades.data(), o->nonzero_finite(), o->max_abs);
    if (device_loss_rule()) {
      GS_CHECK(!(c_.auto_init && !g.upstream_stats), "adaptive: the loss query lacks the statistics it asked for");
      accept_loss_scale(d.s0, d.floor);
      return last_loss_scale_;
    }
    // init_scale "auto" with a moment-based cast_form: S0 before φ from the moments, against the same floor.
    GS_CHECK(g.grad_moments, "adaptive: the loss query lacks the moments it asked for");
    const double s = power_of_two_floor(
        c_.cast_form == "lognormal" ? approx_range_lognormal(*g.grad_log_moments, g.grad_moments->max_abs, params_)
                                    : approx_range_no_weight(*g.grad_moments, params_));
    accept_loss_scale(std::max(phi() * s, d.floor), d.floor);
    return last_loss_scale_;
  }
  std::optional<LossScaleRule> device_loss_rule() const override {
    // init_scale "auto" with a moment-based cast_form reads moments the device does not reduce to S0.
    if (c_.auto_init && c_.cast_form != "measured") return std::nullopt;
    return loss_rule();
  }
  void accept_loss_scale(double s0, double floor) override {
    loss_floor_ = floor;
    last_loss_scale_ = s0;
  }

  StepReport update(const StepStatistics& stats) override {
    // SPEC §6.5: overflows charged where they happened (the layers' φ_l, the loss scale's φ), sized
    // back-offs, recovery after recover_every clean steps; the step is skipped only when a value the
    // update would use is not finite. Without the step's records (replay): §6.4's global halving.
    bool skip = stats.found_inf;
    if (user_) {  // a registered controller: SPEC §6.4's global rule (it sees φ; φ_l are the methods')
      if (stats.found_inf)
        safety_.charge_loss_halving(c_.recover_every);
      else
        safety_.update(StepMonitor{}, params_.u_max, c_.margin, c_.recover_every);
    } else if (stats.monitor != nullptr) {
      safety_.update(*stats.monitor, params_.u_max, c_.margin, c_.recover_every);
      if (c_.derived_bounds) derived_.observe(*stats.monitor, safety_);
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
    derived_.reset(layers.size());
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
    const ScaleBounds b = bounds_of(q.layer_id);
    const double phi = safety_.layer_factor(q.layer_id);
    const bool capped = r.method_name == "measured" && q.upstream_stats &&
                        measured_margin_capped(entry.unbound, q.upstream_stats->max_abs, r.params);
    return {bounded_scale(entry.unbound, q.scale_in, b) * phi, entry.unbound,
            scale_limit(entry.unbound, q.scale_in, b, phi, capped)};
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
    r.bounds = bounds_of(layer_id);
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
    const std::optional<ScaleRule::Formula> formula = method_formula(lr.method_name);
    if (!formula) return std::nullopt;  // element_wise streams every partial product: the host decides
    r.formula = *formula;
    return r;  // the backend fills in K (`reduction`) from the layer
  }

  nlohmann::json config() const override { return adaptive_config_json(c_); }

  nlohmann::json state() const override {
    nlohmann::json layers = nlohmann::json::array();
    for (std::size_t i = 0; i < cache_.size(); ++i) {
      const nlohmann::json safety = safety_.layer_state(static_cast<int>(i));
      const double downstream = derived_.downstream_max(static_cast<int>(i));
      if (cache_[i].computed_at < 0 && safety.is_null() && !(downstream > 0)) continue;
      nlohmann::json l = {{"id", i}, {"computed_at", cache_[i].computed_at}, {"unbound", cache_[i].unbound}};
      if (!safety.is_null()) l.update(safety);
      if (downstream > 0) l["downstream_max"] = downstream;  // D_l of "bounds": "derived"
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
    const double floor = r.number("loss_floor", 0.0, Interval{0, kInf, false, true});  // absent in older states
    const nlohmann::json& layers = state.at("layers");
    GS_CHECK_CONFIG(layers.is_array(), "scaler 'adaptive' state: 'layers' must be an array");
    std::vector<LayerCache> cache(cache_.size());
    LocalSafety safety = safety_;
    safety.clear_layers();
    DerivedBounds derived;
    derived.reset(cache.size());
    for (const nlohmann::json& l : layers) {
      const std::string entry = std::string(where) + ": a 'layers' entry";
      const ConfigReader lr(l, entry, {"id", "computed_at", "unbound", "phi", "clean_steps", "downstream_max"});
      const std::int64_t id = lr.required_integer("id", 0, static_cast<std::int64_t>(cache.size()) - 1);
      LayerCache& c = cache[static_cast<std::size_t>(id)];
      c.computed_at = lr.required_integer("computed_at", -1, std::numeric_limits<std::int64_t>::max());
      c.unbound = lr.required_number("unbound", Interval{0, kInf, true, true});
      safety.restore_layer(static_cast<int>(id), read_phi(lr, entry),
                           lr.integer("clean_steps", 0, 0, c_.recover_every - 1));
      GS_CHECK_CONFIG(c_.derived_bounds || !lr.has("downstream_max"),
                      entry << ": 'downstream_max' belongs to \"bounds\": \"derived\", which this policy does not have");
      derived.restore(static_cast<int>(id), lr.number("downstream_max", 0.0, Interval{0, kInf, false, true}));
    }
    if (user_) user_->restore_controller_state(state.at("controller"));
    safety.restore_loss(phi, clean);
    safety_ = std::move(safety);
    last_loss_scale_ = last;
    loss_floor_ = floor;
    cache_ = std::move(cache);
    derived_ = std::move(derived);
  }

 private:
  void set_format(Format f) {
    default_rule_ = default_layer_rule(c_, f);
    params_ = default_rule_.params;
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
        rules_[i] = override_layer_rule(c_, name, value, format_);
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

  // The bounds a layer's s takes this step: its rule's, and under "bounds": "derived" B_l (its rule's
  // margin and the policy's u_max) on the accumulated scale.
  ScaleBounds bounds_of(int layer_id) const {
    const LayerRule& r = rule(layer_id);
    ScaleBounds b = r.bounds;
    if (c_.derived_bounds && !r.global) b.accum_upper_bound = derived_.accum_bound(layer_id, r.params.u_max, r.params.margin);
    return b;
  }

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

  // S0's rule (lib/scaler/scale_rule.h's loss_scale_decision): base init_scale, or the floor for "auto".
  LossScaleRule loss_rule() const {
    return LossScaleRule{params_, phi(), c_.auto_init ? 1.0 : c_.init_scale, c_.auto_init};
  }

  AdaptiveConfig c_;
  Format format_;
  LayerRule default_rule_;        // the policy's own keys
  std::vector<LayerRule> rules_;  // per layer (bind); default_rule_ for a layer outside the table
  std::unique_ptr<LayerController> user_;  // c_.controller's, when configured
  MethodParams params_;  // the policy's own (default_rule_'s): the loss scale's rules and u_max read them
  std::vector<LayerCache> cache_;
  std::int64_t step_ = 0;
  LocalSafety safety_;          // φ of the loss scale and φ_l per layer (SPEC §6.5)
  DerivedBounds derived_;       // D_l per layer, under "bounds": "derived" (SPEC §6.6)
  double last_loss_scale_ = 1;  // S0 of the last iteration
  double loss_floor_ = 0;       // its floor (SPEC §6.5): 0 before the first iteration
};

}  // namespace

std::unique_ptr<Scaler> make_adaptive_scaler(const nlohmann::json& config, Format format) {
  return std::make_unique<AdaptiveScaler>(parse_adaptive_config(config, format), format);
}

}  // namespace gradscale::adaptive
