// The per-layer policy's local overflow safety (see local_safety.h).
#include "adaptive/local_safety.h"

#include <algorithm>
#include <cmath>

#include "adaptive/math.h"
#include "lib/core/error.h"

namespace gradscale::adaptive {

double back_off_factor(double max_abs, double u_max, int margin) {
  if (!(std::isfinite(max_abs) && max_abs > 0)) return 0.5;
  return std::min(0.5, power_of_two_floor(std::ldexp(u_max, -margin) / max_abs));
}

void LocalSafety::bind(const std::vector<LayerInfo>& layers, bool all_controlled) {
  table_ = layers;
  all_controlled_ = all_controlled;
  layers_.resize(layers.size());
  const auto n = layers.size();
  std::vector<std::vector<int>> consumers(n);
  for (std::size_t c = 0; c < n; ++c)
    for (int in : layers[c].inputs)
      if (in >= 0 && static_cast<std::size_t>(in) < n) consumers[static_cast<std::size_t>(in)].push_back(static_cast<int>(c));
  // From each layer towards the loss: a controlled consumer pays, a pass-through consumer hands the
  // charge on to its own consumers, and a layer no one reads is the loss's. Any order of the table and
  // any cycle (a module an outside engine calls twice) is fine: each layer is visited once per walk.
  charged_.assign(n, {});
  std::vector<char> seen(n);
  std::vector<std::size_t> stack;
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<int>& to = charged_[k];
    std::fill(seen.begin(), seen.end(), 0);
    seen[k] = 1;
    stack.assign(1, k);
    while (!stack.empty()) {
      const std::size_t at = stack.back();
      stack.pop_back();
      if (consumers[at].empty()) to.push_back(-1);  // the loss reads it (or an outside engine's graph)
      for (int c : consumers[at]) {
        const auto ci = static_cast<std::size_t>(c);
        if (controlled(c))
          to.push_back(c);
        else if (!seen[ci]) {
          seen[ci] = 1;
          stack.push_back(ci);
        }
      }
    }
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
  }
}

bool LocalSafety::controlled(int layer_id) const {
  if (all_controlled_) return true;
  return layer_id >= 0 && static_cast<std::size_t>(layer_id) < table_.size() &&
         table_[static_cast<std::size_t>(layer_id)].parametric;
}

const std::vector<int>& LocalSafety::received_from(int id) const {
  static const std::vector<int> loss_only = {-1};
  if (id < 0 || static_cast<std::size_t>(id) >= charged_.size()) return loss_only;
  return charged_[static_cast<std::size_t>(id)];
}

double LocalSafety::layer_factor(int layer_id) const {
  if (layer_id < 0 || static_cast<std::size_t>(layer_id) >= layers_.size()) return 1.0;
  return layers_[static_cast<std::size_t>(layer_id)].phi;
}

bool LocalSafety::update(const StepMonitor& monitor, double u_max, int margin, std::int64_t recover_every) {
  std::vector<double> layer_k(layers_.size(), 1.0);
  double loss_k = 1.0;
  bool any = false;
  // The loss scale's φ halves whatever the overflow (§6.4's rule; S0 has its floor below it).
  const auto charge = [&](int target, double k) {
    double& slot = target < 0 ? loss_k : layer_k[static_cast<std::size_t>(target)];
    slot = std::min(slot, target < 0 ? 0.5 : k);
    any = true;
  };
  if (monitor.loss_overflow) charge(-1, 0.5);
  for (const LayerRecord& r : monitor.records) {
    if (!(r.overflow_upstream || r.overflow_weight || r.overflow_join)) continue;
    const bool primary = std::isfinite(r.overflow_max_abs) || r.layer_id == monitor.first_nonfinite_layer;
    if (!primary || r.layer_id < 0 || static_cast<std::size_t>(r.layer_id) >= layers_.size()) continue;
    const double k = back_off_factor(r.overflow_max_abs, u_max, margin);
    const bool own = r.overflow_upstream && controlled(r.layer_id);
    if (own) charge(r.layer_id, k);
    if ((r.overflow_upstream && !own) || r.overflow_weight || r.overflow_join)
      for (int target : received_from(r.layer_id)) charge(target, k);
  }
  const auto settle = [&](Factor& f, double k) {
    if (k < 1.0) {
      f.phi *= k;
      f.clean = 0;
    } else if (f.phi < 1.0 && ++f.clean >= recover_every) {
      f.phi = std::min(1.0, f.phi * 2);
      f.clean = 0;
    }
  };
  settle(loss_, loss_k);
  for (std::size_t i = 0; i < layers_.size(); ++i) settle(layers_[i], layer_k[i]);
  return any;
}

void LocalSafety::charge_loss_halving(std::int64_t recover_every) {
  StepMonitor loss_only;
  loss_only.loss_overflow = true;
  update(loss_only, 1.0, 0, recover_every);
}

nlohmann::json LocalSafety::layer_state(int layer_id) const {
  const double phi = layer_factor(layer_id);
  if (phi >= 1.0) return nullptr;
  return {{"phi", phi}, {"clean_steps", layers_[static_cast<std::size_t>(layer_id)].clean}};
}

void LocalSafety::restore_loss(double phi, std::int64_t clean) {
  loss_ = Factor{phi, clean};
}

void LocalSafety::restore_layer(int layer_id, double phi, std::int64_t clean) {
  GS_CHECK(layer_id >= 0, "local safety: layer id " << layer_id);
  if (static_cast<std::size_t>(layer_id) >= layers_.size()) layers_.resize(static_cast<std::size_t>(layer_id) + 1);
  layers_[static_cast<std::size_t>(layer_id)] = Factor{phi, clean};
}

void LocalSafety::clear_layers() {
  std::fill(layers_.begin(), layers_.end(), Factor{});
}

}  // namespace gradscale::adaptive
