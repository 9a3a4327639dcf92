// Helpers shared by the tests of the per-layer controllers (tests/test_adaptive_*.cpp): an adaptive
// scaler from a JSON config, and a tensor of normal values fixed by its seed.
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "lib/core/random.h"
#include "lib/scaler/scaler.h"

namespace gradscale::test::adaptive_fixtures {

inline std::unique_ptr<Scaler> adaptive_scaler(nlohmann::json cfg, Format f = Format::fp16) {
  cfg["policy"] = "adaptive";
  return make_scaler(cfg, f);
}

inline Tensor normal_tensor(const Shape& s, std::uint64_t seed, double sigma = 1.0) {
  Tensor t(s);
  Rng rng(seed);
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(sigma * standard_normal(rng));
  return t;
}

}  // namespace gradscale::test::adaptive_fixtures
