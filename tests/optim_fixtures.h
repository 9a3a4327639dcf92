// Helpers shared by the tests of lib/optim (tests/test_optim_*.cpp): parameters with given values,
// deterministic pseudo-random gradients, a bit-for-bit comparison, and configurations with state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "lib/optim/optimizer.h"
#include "lib/optim/parameter.h"

namespace gradscale::test::optim_fixtures {

inline void set(Tensor& t, const std::vector<float>& v) {
  REQUIRE(static_cast<std::size_t>(t.size()) == v.size());
  std::copy(v.begin(), v.end(), t.data());
}

inline Parameter make_param(const std::string& name, const Shape& shape, const std::vector<float>& v,
                            bool decay = true) {
  Parameter p;
  p.name = name;
  p.value = Tensor(shape);
  p.grad = Tensor(shape);
  p.weight_decay = decay;
  set(p.value, v);
  return p;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

// A deterministic pseudo-random gradient for (step, parameter, element), uniform in [lo, hi).
inline void fill_grad(Tensor& g, int step, int param, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000 * step + param));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::int64_t i = 0; i < g.size(); ++i) g[i] = dist(rng);
}

// Configurations that exercise every code path with state.
inline std::vector<nlohmann::json> stateful_configs() {
  using nlohmann::json;
  return {json{{"name", "sgd"}, {"momentum", 0.9}, {"weight_decay", 1e-2}},
          json{{"name", "sgd"}, {"momentum", 0.9}, {"nesterov", true}},
          json{{"name", "adam"}, {"weight_decay", 1e-2}},
          json{{"name", "adamw"}, {"beta1", 0.8}, {"beta2", 0.99}}};
}

}  // namespace gradscale::test::optim_fixtures
