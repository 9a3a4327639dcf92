// Weight initialisation (see init.h).
#include "lib/layers/init.h"

#include <cmath>

#include "lib/core/error.h"

namespace gradscale {

InitSpec parse_init(const std::string& name, double gain) {
  GS_CHECK_CONFIG(std::isfinite(gain) && gain > 0, "init gain must be finite and > 0 (got " << gain << ")");
  InitSpec s;
  s.gain = gain;
  if (name == "kaiming_normal")
    s.kind = InitSpec::Kind::kaiming_normal;
  else if (name == "kaiming_uniform")
    s.kind = InitSpec::Kind::kaiming_uniform;
  else if (name == "xavier_uniform")
    s.kind = InitSpec::Kind::xavier_uniform;
  else
    throw ConfigError("unknown init '" + name +
                      "' (allowed: kaiming_normal, kaiming_uniform, xavier_uniform)");
  return s;
}

void init_weights(Tensor& w, std::int64_t fan_in, std::int64_t fan_out, const InitSpec& spec, Rng& rng) {
  GS_CHECK(fan_in > 0 && fan_out > 0, "fan_in " << fan_in << ", fan_out " << fan_out);
  const auto fi = static_cast<double>(fan_in), fo = static_cast<double>(fan_out);
  for (std::int64_t i = 0; i < w.size(); ++i) {
    double v = 0;
    switch (spec.kind) {
      case InitSpec::Kind::kaiming_normal:
        v = standard_normal(rng) * spec.gain / std::sqrt(fi);
        break;
      case InitSpec::Kind::kaiming_uniform:
        v = (2 * uniform01(rng) - 1) * spec.gain * std::sqrt(3.0 / fi);
        break;
      case InitSpec::Kind::xavier_uniform:
        v = (2 * uniform01(rng) - 1) * spec.gain * std::sqrt(6.0 / (fi + fo));
        break;
    }
    w[i] = static_cast<float>(v);
  }
}

}  // namespace gradscale
