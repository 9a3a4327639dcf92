// Adam / AdamW (see adam.h); the element loop mirrors torch.optim.Adam's and AdamW's single-tensor
// paths (PyTorch 1.13: mul_/add_ for the first moment, addcmul_ for the second, addcdiv_ for the update).
#include "lib/optim/adam.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/error.h"
#include "lib/core/config_reader.h"

namespace gradscale {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const Interval kBetaRange{0.0, 1.0, false, true};
const Interval kEpsRange{0.0, kInf, true, true};
const Interval kWeightDecayRange{0.0, kInf, false, true};

constexpr std::int64_t kChunk = 1024;  // elements per chunk of the update loop (4 KiB of roots on the stack)

const char* optimizer_name(const Adam::Options& o) {
  return o.decoupled ? "adamw" : "adam";
}

void check_options(const Adam::Options& o) {
  const char* name = optimizer_name(o);
  GS_CHECK_CONFIG(kBetaRange.contains(o.beta1), "optimizer '" << name << "': 'beta1' must be in "
                                                              << kBetaRange.text() << ", got " << o.beta1);
  GS_CHECK_CONFIG(kBetaRange.contains(o.beta2), "optimizer '" << name << "': 'beta2' must be in "
                                                              << kBetaRange.text() << ", got " << o.beta2);
  GS_CHECK_CONFIG(kEpsRange.contains(o.eps),
                  "optimizer '" << name << "': 'eps' must be in " << kEpsRange.text() << ", got " << o.eps);
  GS_CHECK_CONFIG(kWeightDecayRange.contains(o.weight_decay),
                  "optimizer '" << name << "': 'weight_decay' must be in " << kWeightDecayRange.text()
                                << ", got " << o.weight_decay);
}

}  // namespace

Adam::Options Adam::Options::from_json(const nlohmann::json& cfg) {
  const std::string name = config_name(cfg, "optimizer", {"adam", "adamw"});
  const ConfigReader r(cfg, "optimizer '" + name + "'",
                                     {"name", "beta1", "beta2", "eps", "weight_decay"});
  Options o;
  o.decoupled = name == "adamw";
  o.beta1 = r.number("beta1", o.beta1, kBetaRange);
  o.beta2 = r.number("beta2", o.beta2, kBetaRange);
  o.eps = r.number("eps", o.eps, kEpsRange);
  o.weight_decay = r.number("weight_decay", o.decoupled ? 0.01 : 0.0, kWeightDecayRange);
  check_options(o);
  return o;
}

Adam::Adam(const Options& options)
    : Optimizer(optimizer_name(options), {"exp_avg", "exp_avg_sq"}), options_(options) {
  check_options(options_);
}

nlohmann::json Adam::config() const {
  return {{"name", optimizer_name(options_)},
          {"beta1", options_.beta1},
          {"beta2", options_.beta2},
          {"eps", options_.eps},
          {"weight_decay", options_.weight_decay}};
}

void Adam::update(Parameter& param, std::vector<Tensor>& slots, std::int64_t step, double lr) {
  const std::int64_t n = param.value.size();
  float* w = param.value.data();
  const float* g = param.grad.data();
  float* m = slots[0].data();
  float* v = slots[1].data();

  // Scalars as torch computes them: Python doubles, cast to float where they meet the tensors.
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, t);
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float beta1 = static_cast<float>(options_.beta1);
  const float one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  const float beta2 = static_cast<float>(options_.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  const double wd = param.weight_decay ? options_.weight_decay : 0.0;
  const bool decay_weight = wd != 0.0 && options_.decoupled;
  const bool decay_grad = wd != 0.0 && !options_.decoupled;
  const float weight_factor = static_cast<float>(1.0 - lr * wd);  // AdamW
  const float wd_f = static_cast<float>(wd);                      // Adam
  if (!param.value.on_host()) {
    const AdamStep s{neg_step_size, bias_correction2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2,
                     eps, weight_factor, wd_f, decay_weight, decay_grad};
    device_kernels(param).adam(w, g, m, v, static_cast<std::size_t>(n), s);
    return;
  }

  // Fixed chunks of kChunk elements, so that the moment loop and the update loop vectorise: a loop that
  // calls std::sqrt stays scalar (sqrtf may set errno), so the roots get a loop of their own. Each
  // element sees the same operations whatever the chunking and the thread count.
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t begin = c * kChunk;
    const std::int64_t len = std::min(kChunk, n - begin);
    float* wc = w + begin;
    const float* gc = g + begin;
    float* mc = m + begin;
    float* vc = v + begin;
    for (std::int64_t i = 0; i < len; ++i) {
      const float wi = decay_weight ? wc[i] * weight_factor : wc[i];
      const float gi = decay_grad ? gc[i] + wd_f * wi : gc[i];
      wc[i] = wi;
      mc[i] = mc[i] * beta1 + one_minus_beta1 * gi;
      vc[i] = vc[i] * beta2 + one_minus_beta2 * gi * gi;
    }
    float root[kChunk];
    for (std::int64_t i = 0; i < len; ++i) root[i] = std::sqrt(vc[i]);
    for (std::int64_t i = 0; i < len; ++i) {
      const float denom = root[i] / bias_correction2_sqrt + eps;
      wc[i] = wc[i] + neg_step_size * mc[i] / denom;
    }
  }
}

}  // namespace gradscale
