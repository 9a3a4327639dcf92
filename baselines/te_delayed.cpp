// Policy `te_delayed`: Transformer Engine delayed scaling (see te_delayed.h).
#include "baselines/te_delayed.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>

#include "baselines/params.h"
#include "lib/core/json_read.h"

namespace gradscale::baselines {
namespace {

struct TeConfig {
  std::int64_t margin = 0;
  std::int64_t history_len = 1024;
  bool most_recent = false;
};

// One scaled tensor: its amax history (oldest first, at most history_len long) and current scale.
struct Target {
  std::deque<double> history;
  double scale = 1.0;
};

constexpr int kLoss = -1;

class TeDelayedScaler final : public Scaler, public LayerController {
 public:
  TeDelayedScaler(const TeConfig& c, Format format) : c_(c), max_finite_(format_info(format).max_finite) {
    targets_[kLoss];
  }

  std::string policy() const override { return "te_delayed"; }
  double loss_scale() const override { return targets_.at(kLoss).scale; }
  LayerController* layer_controller() override { return this; }

  StepReport update(const StepStatistics& stats) override { return {stats.found_inf, loss_scale(), state()}; }

  void bind(const std::vector<LayerInfo>& layers, Format grad_format) override {
    max_finite_ = format_info(grad_format).max_finite;
    for (const LayerInfo& l : layers)
      if (l.parametric) targets_[l.id];
  }
  void begin_step(const StepBegin& /*step*/) override {}
  StatNeeds needs(int /*layer_id*/) const override { return 0; }  // max|g| is always recorded
  LocalScale decide(const LocalScaleQuery& q) override {
    const double s = targets_[q.layer_id].scale / q.scale_in;
    return {s, s};
  }
  void end_step(const StepMonitor& m) override {
    // The amax of this iteration's gradients, in true (unscaled) units, then the new scales.
    push(targets_[kLoss], m.loss_grad_max_abs / targets_[kLoss].scale);
    for (const LayerRecord& r : m.records) {
      const auto it = targets_.find(r.layer_id);
      if (it == targets_.end() || !r.sent_grad) continue;
      push(it->second, r.sent_max_abs / r.scale_out);
    }
  }

  nlohmann::json config() const override {
    return {{"policy", "te_delayed"},
            {"margin", c_.margin},
            {"amax_history_len", c_.history_len},
            {"amax_compute_algo", c_.most_recent ? "most_recent" : "max"}};
  }
  nlohmann::json state() const override {
    nlohmann::json targets = nlohmann::json::array();
    for (const auto& [id, t] : targets_) {
      nlohmann::json h = nlohmann::json::array();
      for (double a : t.history) h.push_back(std::isfinite(a) ? nlohmann::json(a) : nlohmann::json(nullptr));
      targets.push_back({{"id", id}, {"scale", t.scale}, {"history", h}});
    }
    return {{"targets", targets}};
  }
  void restore_state(const nlohmann::json& state) override {
    const ConfigReader r = state_reader(state, "te_delayed", {"targets"});
    const nlohmann::json& list = state.at("targets");
    GS_CHECK_CONFIG(list.is_array(), "scaler 'te_delayed' state: 'targets' must be an array");
    std::map<int, Target> restored;
    for (const nlohmann::json& t : list) {
      const ConfigReader tr(t, "scaler 'te_delayed' state: a target", {"id", "scale", "history"});
      const auto id = static_cast<int>(tr.required_integer("id", kLoss, kMaxInt32));
      GS_CHECK_CONFIG(targets_.count(id), "scaler 'te_delayed' state: target " << id << " is not in this model");
      Target& target = restored[id];
      target.scale = tr.required_number("scale", above(0));
      const nlohmann::json& h = t.at("history");
      GS_CHECK_CONFIG(h.is_array() && static_cast<std::int64_t>(h.size()) <= c_.history_len,
                      "scaler 'te_delayed' state: target " << id << " 'history' must be an array of at most "
                                                           << c_.history_len << " amax values");
      for (const nlohmann::json& a : h) {
        GS_CHECK_CONFIG(a.is_null() || (a.is_number() && a.get<double>() >= 0),
                        "scaler 'te_delayed' state: target " << id << " has amax " << json_excerpt(a));
        target.history.push_back(a.is_null() ? kInf : a.get<double>());
      }
    }
    GS_CHECK_CONFIG(restored.size() == targets_.size(), "scaler 'te_delayed' state has " << restored.size()
                                                                                         << " targets, this model "
                                                                                         << targets_.size());
    targets_ = std::move(restored);
  }

 private:
  void push(Target& t, double amax) {
    t.history.push_back(amax);
    if (static_cast<std::int64_t>(t.history.size()) > c_.history_len) t.history.pop_front();
    // TE's history starts as zeros: a shorter history is the same for both algorithms.
    const double est = c_.most_recent ? t.history.back() : *std::max_element(t.history.begin(), t.history.end());
    if (est > 0 && std::isfinite(est)) t.scale = (max_finite_ / est) / std::ldexp(1.0, static_cast<int>(c_.margin));
  }

  TeConfig c_;
  double max_finite_;
  std::map<int, Target> targets_;
};

}  // namespace

std::unique_ptr<Scaler> make_te_delayed_scaler(const nlohmann::json& config, Format format) {
  const ConfigReader r = config_reader(config, "te_delayed", {"margin", "amax_history_len", "amax_compute_algo"});
  TeConfig c;
  c.margin = r.integer("margin", 0, 0, 64);
  c.history_len = r.integer("amax_history_len", 1024, 1, 1 << 20);
  if (r.has("amax_compute_algo")) {
    const nlohmann::json& a = config.at("amax_compute_algo");
    GS_CHECK_CONFIG(a == "max" || a == "most_recent",
                    "scaler 'te_delayed': 'amax_compute_algo' must be \"max\" or \"most_recent\", got " << json_excerpt(a));
    c.most_recent = a == "most_recent";
  }
  return std::make_unique<TeDelayedScaler>(c, format);
}

}  // namespace gradscale::baselines
