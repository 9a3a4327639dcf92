// Weight initialisation from a seed (Kaiming / Xavier), deterministic on every platform.
#pragma once

#include <cstdint>
#include <string>

#include "lib/core/random.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

struct InitSpec {
  enum class Kind { kaiming_normal, kaiming_uniform, xavier_uniform } kind = Kind::kaiming_normal;
  double gain = 1.4142135623730951;  // sqrt(2): ReLU
};

InitSpec parse_init(const std::string& name, double gain);  // "kaiming_normal", ...; ConfigError otherwise

// Fills `w` given its fan-in and fan-out: kaiming_normal N(0, gain^2/fan_in), kaiming_uniform
// U(±gain·sqrt(3/fan_in)), xavier_uniform U(±gain·sqrt(6/(fan_in+fan_out))).
void init_weights(Tensor& w, std::int64_t fan_in, std::int64_t fan_out, const InitSpec& spec, Rng& rng);

}  // namespace gradscale
