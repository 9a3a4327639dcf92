// Tests of lib/optim's updates: SGD / Nesterov / weight decay / Adam / AdamW against hand-worked values
// (inputs exact by construction) and against fp64 references with forward error bounds derived from
// fp32 epsilon.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/optim/adam.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "lib/optim/sgd.h"
#include "tests/optim_fixtures.h"

using gradscale::Adam;
using gradscale::ConfigError;
using gradscale::LrSchedule;
using gradscale::Optimizer;
using gradscale::Parameter;
using gradscale::Sgd;
using gradscale::Shape;
using gradscale::Tensor;
using nlohmann::json;
using namespace gradscale::test::optim_fixtures;

namespace {

// Every rounding of a float operation is within a factor (1 ± u), u = FLT_EPSILON / 2. The error bounds
// below charge a full FLT_EPSILON per rounding (and per cast of a hyperparameter to float), which also
// covers the second-order terms a first-order analysis drops.
constexpr double kEps32 = FLT_EPSILON;

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.size());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// SGD: hand-worked values. Weights, gradients and hyperparameters are small dyadic numbers, so every
// float operation is exact and the results must match to the bit.

TEST_CASE("SGD without momentum: w -= lr * g, exactly", "[optim]") {
  Sgd opt(Sgd::Options{});
  Parameter p = make_param("w", {4}, {1, -2, 0.5f, 3});
  set(p.grad, {1, 2, -4, 0});
  opt.step({&p}, 0.25);
  CHECK(values(p.value) == std::vector<float>{0.75f, -2.5f, 1.5f, 3});
  set(p.grad, {-2, 1, 1, 8});
  opt.step({&p}, 0.25);
  CHECK(values(p.value) == std::vector<float>{1.25f, -2.75f, 1.25f, 1});
  CHECK(opt.step_count() == 2);
  CHECK(opt.state_tensors().empty());  // momentum 0 keeps no state, like torch
}

TEST_CASE("SGD momentum: the first step copies d into the buffer, later b = mu*b + d", "[optim]") {
  Sgd opt(Sgd::Options{0.5, false, 0.0});
  Parameter p = make_param("w", {2}, {1, 2});
  const std::vector<std::vector<float>> grads = {{2, -4}, {4, 2}, {0, 0}};
  // b1 = (2,-4), w1 = (0, 4); b2 = (5, 0), w2 = (-2.5, 4); b3 = (2.5, 0), w3 = (-3.75, 4).
  const std::vector<std::vector<float>> expected_w = {{0, 4}, {-2.5f, 4}, {-3.75f, 4}};
  const std::vector<std::vector<float>> expected_b = {{2, -4}, {5, 0}, {2.5f, 0}};
  for (std::size_t k = 0; k < grads.size(); ++k) {
    set(p.grad, grads[k]);
    opt.step({&p}, 0.5);
    CHECK(values(p.value) == expected_w[k]);
    const auto state = opt.state_tensors();
    REQUIRE(state.size() == 1);
    CHECK(state[0].first == "w/momentum_buffer");
    CHECK(values(*state[0].second) == expected_b[k]);
  }
}

TEST_CASE("SGD Nesterov: u = d + mu*b", "[optim]") {
  Sgd opt(Sgd::Options{0.5, true, 0.0});
  Parameter p = make_param("w", {2}, {1, 2});
  const std::vector<std::vector<float>> grads = {{2, -4}, {4, 2}, {0, 0}};
  // u1 = (3,-6), w1 = (-0.5, 5); b2 = (5,0), u2 = (6.5, 2), w2 = (-3.75, 4); b3 = (2.5,0), u3 = (1.25,0).
  const std::vector<std::vector<float>> expected_w = {{-0.5f, 5}, {-3.75f, 4}, {-4.375f, 4}};
  for (std::size_t k = 0; k < grads.size(); ++k) {
    set(p.grad, grads[k]);
    opt.step({&p}, 0.5);
    CHECK(values(p.value) == expected_w[k]);
  }
}

TEST_CASE("SGD weight decay is coupled L2 on decayed parameters only", "[optim]") {
  Sgd opt(Sgd::Options{0.0, false, 0.25});
  Parameter w = make_param("w", {2}, {4, -8});
  Parameter b = make_param("b", {1}, {4}, /*decay=*/false);
  set(w.grad, {1, 1});
  set(b.grad, {1});
  opt.step({&w, &b}, 0.5);  // d = (1 + 1, 1 - 2) = (2, -1)
  CHECK(values(w.value) == std::vector<float>{3, -7.5f});
  CHECK(values(b.value) == std::vector<float>{3.5f});
  set(w.grad, {0, 0});
  set(b.grad, {0});
  opt.step({&w, &b}, 0.5);  // d = (0.75, -1.875): decay alone shrinks w; the bias stays
  CHECK(values(w.value) == std::vector<float>{2.625f, -6.5625f});
  CHECK(values(b.value) == std::vector<float>{3.5f});
}

// ---------------------------------------------------------------------------------------------------
// SGD against fp64 with a running first-order forward error bound per element (absolute, since momentum
// sums gradients of both signs). E_x is the bound on |float x - exact x|:
//   d = g + wd*w     E_d = eps*(2|wd*w| + |d|) + wd*E_w
//   b = mu*b + d     E_b = mu*E_b + eps*(2|mu*b| + |b'|) + E_d
//   u = d + mu*b     E_u = E_d + mu*E_b + eps*(2|mu*b| + |u|)        (Nesterov; else u = b)
//   w = w - lr*u     E_w = E_w + lr*E_u + eps*(2|lr*u| + |w'|)

TEST_CASE("SGD momentum / Nesterov / weight decay match fp64 within the fp32 error bound", "[optim]") {
  for (const bool nesterov : {false, true}) {
    for (const double wd : {0.0, 1e-2}) {
      CAPTURE(nesterov, wd);
      const double mu = 0.9;
      Sgd opt(Sgd::Options{mu, nesterov, wd});
      const int n = 257;
      Parameter p = make_param("w", {n}, std::vector<float>(n, 0.0f));
      fill_grad(p.value, 0, 7);
      std::vector<double> w(p.value.data(), p.value.data() + n), b(n, 0.0), ew(n, 0.0), eb(n, 0.0);
      int violations = 0;
      double max_bound = 0.0;
      for (int step = 1; step <= 25; ++step) {
        const double lr = 0.05 * (1 + step % 3);
        fill_grad(p.grad, step, 0);
        opt.step({&p}, lr);
        for (int i = 0; i < n; ++i) {
          const double g = p.grad[i];
          const double d = g + wd * w[i];
          const double ed = kEps32 * (2 * std::fabs(wd * w[i]) + std::fabs(d)) + wd * ew[i];
          const double b_new = step == 1 ? d : mu * b[i] + d;
          eb[i] = step == 1 ? ed : mu * eb[i] + kEps32 * (2 * std::fabs(mu * b[i]) + std::fabs(b_new)) + ed;
          b[i] = b_new;
          double u = b[i], eu = eb[i];
          if (nesterov) {
            u = d + mu * b[i];
            eu = ed + mu * eb[i] + kEps32 * (2 * std::fabs(mu * b[i]) + std::fabs(u));
          }
          w[i] -= lr * u;
          ew[i] += lr * eu + kEps32 * (2 * std::fabs(lr * u) + std::fabs(w[i]));
          if (std::fabs(static_cast<double>(p.value[i]) - w[i]) > ew[i]) ++violations;
          max_bound = std::max(max_bound, ew[i]);
        }
      }
      CHECK(violations == 0);
      CHECK(max_bound < 1e-4);  // the bound is tight enough to catch a wrong formula (steps are ~0.05)
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Adam / AdamW: the first step, worked by hand. With bias correction, m^ = g and v^ = g^2 after one
// step, so every weight moves by lr * g / (|g| + eps): almost exactly lr * sign(g), whatever |g| is.

TEST_CASE("Adam's first step moves every weight by lr * g / (|g| + eps)", "[optim]") {
  Adam opt(Adam::Options{});
  Parameter p = make_param("w", {5}, {1, 1, 1, 1, 1});
  const std::vector<float> g = {1, -1, 1e-3f, -0.5f, 64};
  set(p.grad, g);
  const double lr = 0.01;
  opt.step({&p}, lr);
  for (int i = 0; i < 5; ++i) {
    const double gi = g[static_cast<std::size_t>(i)];
    const double expected = 1.0 - lr * gi / (std::fabs(gi) + 1e-8);
    // About 16 roundings touch the update, one the final sum.
    CHECK(std::fabs(p.value[i] - expected) <= 16 * kEps32 * lr + kEps32 * std::fabs(expected));
  }
}

TEST_CASE("AdamW decays the weight by (1 - lr*wd) outside the adaptive step, Adam inside it", "[optim]") {
  const double lr = 0.01, wd = 0.1;
  // w = 2, g = -0.01. AdamW: w1 = 2 * (1 - lr*wd) + lr (g < 0 pushes up).
  // Adam (coupled): g' = g + wd*w = 0.19 > 0, so the step goes the other way: w1 = 2 - lr.
  Parameter pw = make_param("w", {1}, {2});
  Parameter pa = make_param("w", {1}, {2});
  set(pw.grad, {-0.01f});
  set(pa.grad, {-0.01f});
  Adam adamw(Adam::Options{0.9, 0.999, 1e-8, wd, true});
  Adam adam(Adam::Options{0.9, 0.999, 1e-8, wd, false});
  adamw.step({&pw}, lr);
  adam.step({&pa}, lr);
  const double tol = 16 * kEps32 * lr + kEps32 * 2.0;
  CHECK(std::fabs(pw.value[0] - (2.0 * (1.0 - lr * wd) + lr * 0.01 / (0.01 + 1e-8))) <= tol);
  CHECK(std::fabs(pa.value[0] - (2.0 - lr * 0.19 / (0.19 + 1e-8))) <= tol);
  CHECK(adamw.config()["name"] == "adamw");
}

// Adam against fp64 over many steps. Weights and gradients are positive, so m, v, the denominator and
// the update are sums, products, quotients and roots of positive numbers and their relative errors add:
//   g = g + wd*w        rel_g = rel_w + 3 eps          (Adam; AdamW: w *= 1-lr*wd, rel_w += 2 eps)
//   m = b1*m + (1-b1)*g rel_m = max(rel_m, rel_g) + 3 eps
//   v = b2*v + (1-b2)gg rel_v = max(rel_v, 2 rel_g) + 4 eps
//   den = sqrt(v)/c2 + e  rel_den = rel_v/2 + 4 eps
//   delta = -s*m/den    rel_delta = rel_m + rel_den + 3 eps
//   w = w + delta       E_w += |delta| rel_delta + eps |w'|   (absolute; rel_w = E_w / |w|)

TEST_CASE("Adam and AdamW match fp64 within the fp32 error bound over 30 steps", "[optim]") {
  struct Case {
    double wd;
    bool decoupled;
  };
  for (const Case c : {Case{0.0, false}, Case{0.1, false}, Case{0.1, true}}) {
    CAPTURE(c.wd, c.decoupled);
    const double b1 = 0.9, b2 = 0.999, e = 1e-8;
    Adam opt(Adam::Options{b1, b2, e, c.wd, c.decoupled});
    const int n = 199;
    Parameter p = make_param("w", {n}, std::vector<float>(n, 0.0f));
    fill_grad(p.value, 0, 9, 0.5f, 1.5f);
    std::vector<double> w(p.value.data(), p.value.data() + n), m(n, 0.0), v(n, 0.0);
    std::vector<double> ew(n, 0.0), rm(n, 0.0), rv(n, 0.0);
    int violations = 0;
    double max_bound = 0.0;
    for (int step = 1; step <= 30; ++step) {
      const double lr = 0.01 * (1.0 + 0.1 * (step % 4));
      fill_grad(p.grad, step, 0, 0.01f, 1.0f);
      opt.step({&p}, lr);
      const double c1 = 1.0 - std::pow(b1, step), c2 = std::sqrt(1.0 - std::pow(b2, step));
      for (int i = 0; i < n; ++i) {
        double rw = ew[i] / w[i];
        if (c.decoupled && c.wd != 0.0) {
          w[i] *= 1.0 - lr * c.wd;
          rw += 2 * kEps32;
        }
        double g = p.grad[i], rg = 0.0;
        if (!c.decoupled && c.wd != 0.0) {
          g += c.wd * w[i];
          rg = rw + 3 * kEps32;
        }
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        rm[i] = std::max(rm[i], rg) + 3 * kEps32;
        rv[i] = std::max(rv[i], 2 * rg) + 4 * kEps32;
        const double delta = -(lr / c1) * m[i] / (std::sqrt(v[i]) / c2 + e);
        const double rdelta = rm[i] + rv[i] / 2 + 7 * kEps32;
        const double w_old_bound = rw * w[i];
        w[i] += delta;
        ew[i] = w_old_bound + std::fabs(delta) * rdelta + kEps32 * std::fabs(w[i]);
        if (std::fabs(static_cast<double>(p.value[i]) - w[i]) > ew[i]) ++violations;
        max_bound = std::max(max_bound, ew[i]);
      }
    }
    CHECK(violations == 0);
    CHECK(max_bound < 1e-4);  // per-step updates are ~0.01: a wrong formula is far outside
  }
}

namespace {

// Host memory that calls itself a device: parameters on it take the optimizer's device kernels.
class FakeDeviceMemory final : public gradscale::DeviceMemory {
 public:
  gradscale::Device device() const override { return gradscale::Device::cuda; }
  float* allocate(std::size_t n) override { return new float[n]; }
  void release(float* p) noexcept override { delete[] p; }
  void fill(float* p, std::size_t n, float value) override { std::fill(p, p + n, value); }
  void copy(float* dst, const float* src, std::size_t n) override { std::copy(src, src + n, dst); }
  void from_host(float* dst, const float* host, std::size_t n) override { std::copy(host, host + n, dst); }
  void to_host(float* host, const float* src, std::size_t n) override { std::copy(src, src + n, host); }
};

// Records the bracket and the updates; the update numbered `throw_at` (1-based) throws.
class RecordingKernels final : public gradscale::DeviceOptimizerKernels {
 public:
  void sgd(float*, const float*, float*, std::size_t, const gradscale::SgdStep&) override { note(); }
  void adam(float*, const float*, float*, float*, std::size_t, const gradscale::AdamStep&) override { note(); }
  void begin_step() override { log += "begin "; }
  void end_step(bool apply) override { log += apply ? "end(apply)" : "end(drop)"; }
  int throw_at = 0;
  int updates = 0;
  std::string log;

 private:
  void note() {
    ++updates;
    log += "u ";
    if (updates == throw_at) throw gradscale::Error("a device update failed");
  }
};

}  // namespace

TEST_CASE("Optimizer::step brackets its device updates, and an update that throws drops the queued ones",
          "[optim]") {
  FakeDeviceMemory memory;
  for (const char* name : {"adam", "sgd"}) {
    INFO(name);
    std::vector<Parameter> params(3);
    std::vector<Parameter*> pointers;
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].name = "p" + std::to_string(i);
      params[i].value = Tensor({4}, 1.0f, &memory);
      params[i].grad = Tensor({4}, 0.5f, &memory);
      pointers.push_back(&params[i]);
    }
    auto opt = gradscale::make_optimizer({{"name", name}});
    RecordingKernels kernels;
    opt->use_device(&kernels);
    opt->step(pointers, 0.1);
    CHECK(kernels.log == "begin u u u end(apply)");
    CHECK(opt->step_count() == 1);
    // The second update of the next step throws: the step ends without applying what was queued, and
    // it is not counted.
    kernels.log.clear();
    kernels.updates = 0;
    kernels.throw_at = 2;
    CHECK_THROWS_WITH(opt->step(pointers, 0.1), Catch::Contains("a device update failed"));
    CHECK(kernels.log == "begin u u end(drop)");
    CHECK(opt->step_count() == 1);
  }
}
