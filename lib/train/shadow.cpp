// The fp32 shadow of the backward pass (see shadow.h).
#include "lib/train/shadow.h"

#include <cmath>
#include <limits>

#include "lib/model/model.h"

namespace gradscale {

void ShadowSums::add_mass(const float* before, const float* after, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = std::fabs(static_cast<double>(before[i]));
    if (!std::isfinite(v)) continue;
    total += v;
    if (after[i] == 0.0f) lost += v;
  }
}

void ShadowSums::add_error(const float* lp, double lp_scale, const float* ref, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double a = static_cast<double>(lp[i]) / lp_scale, b = ref[i];
    diff2 += (a - b) * (a - b);
    ref2 += b * b;
    lp2 += a * a;
    dot += a * b;
  }
}

ShadowMetrics ShadowSums::metrics() const {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  ShadowMetrics m;
  m.underflow_mass = total > 0 ? lost / total : 0.0;
  m.rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 == 0 ? 0.0 : kNaN);
  m.cosine = ref2 > 0 && lp2 > 0 ? dot / std::sqrt(ref2 * lp2) : (diff2 == 0 ? 1.0 : kNaN);
  return m;
}

void ShadowRecorder::upstream(int layer_id, const float* /*before*/, const float* after, std::size_t n,
                              double /*scale*/) {
  upstream_[layer_id].assign(after, after + n);  // fp32 at scale 1: nothing was rounded
}

void ShadowRecorder::take_weight_grads(Model& model) {
  for (int id = 0; id < model.num_layers(); ++id)
    for (Parameter* p : model.layer(id).parameters())
      weight_grads_[id].emplace_back(p->grad.data(), p->grad.data() + p->grad.size());
}

void ShadowComparison::upstream(int layer_id, const float* before, const float* after, std::size_t n,
                                double scale) {
  const auto found = shadow_.upstream_.find(layer_id);
  if (found == shadow_.upstream_.end() || found->second.size() != n) return;
  ShadowSums sums;
  sums.add_mass(before, after, n);
  sums.add_error(after, scale, found->second.data(), n);
  LayerRecord& r = monitor_.record_of(layer_id);
  r.shadow_upstream = sums.metrics();
  r.has_shadow_upstream = true;
}

void ShadowComparison::weight(int layer_id, const float* before, const float* after, std::size_t n,
                              double /*scale*/) {
  weight_mass_[layer_id].add_mass(before, after, n);
}

void ShadowComparison::finish(Model& model) {
  for (int id = 0; id < model.num_layers(); ++id) {
    const auto found = shadow_.weight_grads_.find(id);
    const std::vector<Parameter*> params = model.layer(id).parameters();
    if (found == shadow_.weight_grads_.end() || params.empty() || found->second.size() != params.size()) continue;
    ShadowSums sums;
    const auto mass = weight_mass_.find(id);
    if (mass != weight_mass_.end()) {
      sums.lost = mass->second.lost;
      sums.total = mass->second.total;
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::vector<float>& ref = found->second[k];
      if (ref.size() != static_cast<std::size_t>(params[k]->grad.size())) continue;
      sums.add_error(params[k]->grad.data(), 1.0, ref.data(), ref.size());
    }
    LayerRecord& r = monitor_.record_of(id);
    r.shadow_weight = sums.metrics();
    r.has_shadow_weight = true;
  }
}

}  // namespace gradscale
