// Helpers shared by the tests of lib/cuda's layer and optimizer kernels (tests/test_cuda_*.cpp that
// compare with lib/layers): tensors from and to value lists, normal values, and one CPU layer run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/random.h"
#include "lib/layers/layer.h"
#include "lib/scaler/scaler.h"

namespace gradscale::test::cuda_layers_fixtures {

inline std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.size());
}

inline Tensor tensor_of(const Shape& s, const std::vector<float>& v) {
  Tensor t(s);
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

inline std::vector<float> normals(std::size_t n, Rng& rng, double sigma = 1.0, double mean = 0.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + sigma * standard_normal(rng));
  return v;
}

// One CPU layer run at fp32 precision with a global policy (local scale 1), as the engine runs it.
struct CpuRun {
  Precision precision;
  std::unique_ptr<Scaler> scaler = make_scaler(nlohmann::json{{"policy", "none"}}, Format::fp32);
  StepMonitor monitor;
  CpuRun() { monitor.reset(1, false, 0.0); }
  Tensor forward(Layer& layer, const Tensor& x, bool training = true) {
    ForwardContext ctx{precision, training, nullptr};
    Tensor y;
    layer.forward({&x}, y, ctx);
    return y;
  }
  Tensor backward(Layer& layer, const Tensor& x, const Tensor& y, const Tensor& g) {
    ScaledGrad gy{g, 1.0}, gx;
    BackwardContext ctx{precision, *scaler, monitor};
    layer.backward({&x}, y, gy, {&gx}, ctx);
    return gx.g;
  }
};

}  // namespace gradscale::test::cuda_layers_fixtures
