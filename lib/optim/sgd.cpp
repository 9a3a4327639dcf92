// SGD with momentum / Nesterov / coupled weight decay (see sgd.h); the element loop mirrors
// torch.optim.SGD's single-tensor path (PyTorch 1.13) operation by operation.
#include "lib/optim/sgd.h"

#include <limits>

#include "lib/core/error.h"
#include "lib/core/config_reader.h"

namespace gradscale {
namespace {

const Interval kMomentumRange{0.0, 1.0, false, true};
const Interval kWeightDecayRange{0.0, std::numeric_limits<double>::infinity(), false, true};

void check_options(const Sgd::Options& o) {
  GS_CHECK_CONFIG(kMomentumRange.contains(o.momentum), "optimizer 'sgd': 'momentum' must be in "
                                                           << kMomentumRange.text() << ", got "
                                                           << o.momentum);
  GS_CHECK_CONFIG(kWeightDecayRange.contains(o.weight_decay), "optimizer 'sgd': 'weight_decay' must be in "
                                                                  << kWeightDecayRange.text() << ", got "
                                                                  << o.weight_decay);
  GS_CHECK_CONFIG(!o.nesterov || o.momentum > 0.0,
                  "optimizer 'sgd': 'nesterov' requires 'momentum' in (0, 1), got " << o.momentum);
}

}  // namespace

Sgd::Options Sgd::Options::from_json(const nlohmann::json& cfg) {
  config_name(cfg, "optimizer", {"sgd"});
  const ConfigReader r(cfg, "optimizer 'sgd'",
                                     {"name", "momentum", "nesterov", "weight_decay"});
  Options o;
  o.momentum = r.number("momentum", o.momentum, kMomentumRange);
  o.nesterov = r.boolean("nesterov", o.nesterov);
  o.weight_decay = r.number("weight_decay", o.weight_decay, kWeightDecayRange);
  check_options(o);
  return o;
}

Sgd::Sgd(const Options& options)
    : Optimizer("sgd", options.momentum > 0.0 ? std::vector<std::string>{"momentum_buffer"}
                                              : std::vector<std::string>{}),
      options_(options) {
  check_options(options_);
}

nlohmann::json Sgd::config() const {
  return {{"name", "sgd"},
          {"momentum", options_.momentum},
          {"nesterov", options_.nesterov},
          {"weight_decay", options_.weight_decay}};
}

void Sgd::update(Parameter& param, std::vector<Tensor>& slots, std::int64_t step, double lr) {
  const std::int64_t n = param.value.size();
  float* w = param.value.data();
  const float* g = param.grad.data();
  // torch casts every Python scalar to the tensor's dtype: the hyperparameters enter as floats.
  const float lr_f = static_cast<float>(lr);
  const float wd = param.weight_decay ? static_cast<float>(options_.weight_decay) : 0.0f;
  if (!param.value.on_host()) {
    const SgdStep s{lr_f, static_cast<float>(options_.momentum), wd, options_.nesterov, step == 1};
    device_kernels(param).sgd(w, g, slots.empty() ? nullptr : slots[0].data(), static_cast<std::size_t>(n), s);
    return;
  }

  if (slots.empty()) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (std::int64_t i = 0; i < n; ++i) {
      const float d = wd != 0.0f ? g[i] + wd * w[i] : g[i];
      w[i] = w[i] - lr_f * d;
    }
    return;
  }

  float* buf = slots[0].data();
  const float mu = static_cast<float>(options_.momentum);
  const bool first = step == 1;  // torch initialises the buffer to a copy of d on its first step
  const bool nesterov = options_.nesterov;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = wd != 0.0f ? g[i] + wd * w[i] : g[i];
    const float b = first ? d : buf[i] * mu + d;
    buf[i] = b;
    const float u = nesterov ? d + mu * b : b;
    w[i] = w[i] - lr_f * u;
  }
}

}  // namespace gradscale
