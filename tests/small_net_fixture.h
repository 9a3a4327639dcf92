// A small conv → ReLU → flatten → linear model on 1×28×28 inputs, for the tests of what a trace and its
// header say about the model (tests/test_trace_header.cpp, tests/test_trace_model_name.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <gradscale/gradscale.h>

namespace gradscale::testing {

// Named when `name` is not empty; weights drawn from Rng(seed).
inline std::unique_ptr<Model> small_conv_net(const std::string& name, std::uint64_t seed) {
  Rng rng(seed);
  const InitSpec init;
  auto net = std::make_unique<Model>(name);
  const int c = net->add(std::make_unique<Conv2d>("c", 1, 4, 3, 2, 1, true, init, rng), {Model::kModelInput});
  const int r = net->add(std::make_unique<ReLU>("r"), {c});
  const int f = net->add(std::make_unique<Flatten>("f"), {r});
  net->add(std::make_unique<Linear>("fc", 4 * 14 * 14, 10, true, init, rng), {f});
  net->finalize({1, 28, 28});
  return net;
}

}  // namespace gradscale::testing
