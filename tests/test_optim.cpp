// Tests of lib/optim: SGD / Nesterov / weight decay / Adam / AdamW against hand-worked values (inputs exact
// by construction) and fp64 references with forward error bounds derived from fp32 epsilon; skipped steps,
// checkpoint state and bit-identical resume; LR schedules; configuration errors.
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

using gradscale::Adam;
using gradscale::ConfigError;
using gradscale::LrSchedule;
using gradscale::Optimizer;
using gradscale::Parameter;
using gradscale::Sgd;
using gradscale::Shape;
using gradscale::Tensor;
using nlohmann::json;

namespace {

// Every rounding of a float operation is within a factor (1 ± u), u = FLT_EPSILON / 2. The error bounds
// below charge a full FLT_EPSILON per rounding (and per cast of a hyperparameter to float), which also
// covers the second-order terms a first-order analysis drops.
constexpr double kEps32 = FLT_EPSILON;

void set(Tensor& t, const std::vector<float>& v) {
  REQUIRE(static_cast<std::size_t>(t.size()) == v.size());
  std::copy(v.begin(), v.end(), t.data());
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.size());
}

Parameter make_param(const std::string& name, const Shape& shape, const std::vector<float>& v,
                     bool decay = true) {
  Parameter p;
  p.name = name;
  p.value = Tensor(shape);
  p.grad = Tensor(shape);
  p.weight_decay = decay;
  set(p.value, v);
  return p;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

// A deterministic pseudo-random gradient for (step, parameter, element), uniform in [lo, hi).
void fill_grad(Tensor& g, int step, int param, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000 * step + param));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::int64_t i = 0; i < g.size(); ++i) g[i] = dist(rng);
}

// Two parameters as a layer has them: a decayed weight and a non-decayed bias.
struct TinyModel {
  Parameter weight =
      make_param("fc1.weight", {3, 4}, {0.5f, -1, 2, 0.25f, 1, 1.5f, -0.75f, 3, -2, 0.125f, 1, -1});
  Parameter bias = make_param("fc1.bias", {4}, {0.1f, -0.2f, 0.3f, 0}, /*decay=*/false);
  std::vector<Parameter*> params() { return {&weight, &bias}; }
  void set_grads(int step) {
    fill_grad(weight.grad, step, 0);
    fill_grad(bias.grad, step, 1);
  }
};

// Configurations that exercise every code path with state.
std::vector<json> stateful_configs() {
  return {json{{"name", "sgd"}, {"momentum", 0.9}, {"weight_decay", 1e-2}},
          json{{"name", "sgd"}, {"momentum", 0.9}, {"nesterov", true}},
          json{{"name", "adam"}, {"weight_decay", 1e-2}},
          json{{"name", "adamw"}, {"beta1", 0.8}, {"beta2", 0.99}}};
}

LrSchedule warmup_cosine() {
  return LrSchedule::from_json(
      {{"name", "cosine"}, {"lr", 0.05}, {"total_steps", 12}, {"warmup_steps", 3}, {"min_lr", 0.001}});
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

// ---------------------------------------------------------------------------------------------------
// Skipped steps, checkpoint state and resume.

TEST_CASE("a skipped step leaves weights, moments, step count and the schedule bit-identical", "[optim]") {
  const LrSchedule schedule = warmup_cosine();
  for (const json& cfg : stateful_configs()) {
    CAPTURE(cfg.dump());
    // Run A has an overflowing iteration after its third step; run B never sees that iteration.
    TinyModel a, b;
    auto opt_a = gradscale::make_optimizer(cfg);
    auto opt_b = gradscale::make_optimizer(cfg);
    int step_b = 0;
    for (int iteration = 0; iteration < 8; ++iteration) {
      if (iteration == 3) {
        const TinyModel before = a;
        const json state_before = opt_a->state();
        std::vector<Tensor> moments_before;
        for (const auto& st : opt_a->state_tensors()) moments_before.push_back(*st.second);
        // The overflowing iteration: non-finite gradients, found_inf, step not applied.
        a.weight.grad.fill(INFINITY);
        a.bias.grad.fill(NAN);
        CHECK(same_bits(a.weight.value, before.weight.value));
        CHECK(same_bits(a.bias.value, before.bias.value));
        CHECK(opt_a->state() == state_before);
        const auto moments_after = opt_a->state_tensors();
        REQUIRE(moments_after.size() == moments_before.size());
        for (std::size_t k = 0; k < moments_before.size(); ++k)
          CHECK(same_bits(*moments_after[k].second, moments_before[k]));
        continue;
      }
      ++step_b;
      a.set_grads(step_b);
      opt_a->step(a.params(), schedule.lr(opt_a->step_count()));
      b.set_grads(step_b);
      opt_b->step(b.params(), schedule.lr(opt_b->step_count()));
    }
    CHECK(opt_a->step_count() == 7);
    CHECK(opt_a->state() == opt_b->state());
    CHECK(same_bits(a.weight.value, b.weight.value));
    CHECK(same_bits(a.bias.value, b.bias.value));
    const auto sa = opt_a->state_tensors();
    const auto sb = opt_b->state_tensors();
    REQUIRE(sa.size() == sb.size());
    for (std::size_t k = 0; k < sa.size(); ++k) CHECK(same_bits(*sa[k].second, *sb[k].second));
  }
}

TEST_CASE("state saved mid-run as JSON + raw tensors resumes bit-identically", "[optim]") {
  const LrSchedule schedule = warmup_cosine();
  for (const json& cfg : stateful_configs()) {
    CAPTURE(cfg.dump());
    TinyModel run;
    auto opt = gradscale::make_optimizer(cfg);
    for (int step = 1; step <= 5; ++step) {
      run.set_grads(step);
      opt->step(run.params(), schedule.lr(opt->step_count()));
    }
    // The checkpoint: scalars as JSON text, tensors as raw bytes with key and shape; the model's weights.
    const std::string state_text = opt->state().dump();
    struct Blob {
      std::string key;
      Shape shape;
      std::vector<char> bytes;
    };
    std::vector<Blob> blobs;
    for (const auto& [key, tensor] : opt->state_tensors()) {
      Blob blob{key, tensor->shape(),
                std::vector<char>(static_cast<std::size_t>(tensor->size()) * sizeof(float))};
      std::memcpy(blob.bytes.data(), tensor->data(), blob.bytes.size());
      blobs.push_back(std::move(blob));
    }
    REQUIRE_FALSE(blobs.empty());
    const TinyModel saved_model = run;

    // The uninterrupted run goes on.
    for (int step = 6; step <= 10; ++step) {
      run.set_grads(step);
      opt->step(run.params(), schedule.lr(opt->step_count()));
    }

    // The resumed run: a new optimizer from the stored config, the stored state, a new model object.
    TinyModel resumed = saved_model;
    const json state = json::parse(state_text);
    auto opt2 = gradscale::make_optimizer(state.at("optimizer"));
    opt2->restore_state(state, resumed.params());
    CHECK(opt2->step_count() == 5);
    const auto tensors = opt2->state_tensors();
    REQUIRE(tensors.size() == blobs.size());
    for (std::size_t k = 0; k < blobs.size(); ++k) {
      REQUIRE(tensors[k].first == blobs[k].key);
      REQUIRE(tensors[k].second->shape() == blobs[k].shape);
      std::memcpy(tensors[k].second->data(), blobs[k].bytes.data(), blobs[k].bytes.size());
    }
    for (int step = 6; step <= 10; ++step) {
      resumed.set_grads(step);
      opt2->step(resumed.params(), schedule.lr(opt2->step_count()));
    }
    CHECK(same_bits(resumed.weight.value, run.weight.value));
    CHECK(same_bits(resumed.bias.value, run.bias.value));
    CHECK(opt2->state() == opt->state());
    const auto s1 = opt->state_tensors();
    const auto s2 = opt2->state_tensors();
    for (std::size_t k = 0; k < s1.size(); ++k) CHECK(same_bits(*s1[k].second, *s2[k].second));

    // Without the restored state (same weights and learning rates, fresh moments and step count) the
    // continuation differs: the comparison above can see a lost moment.
    TinyModel fresh = saved_model;
    auto opt3 = gradscale::make_optimizer(cfg);
    for (int step = 6; step <= 10; ++step) {
      fresh.set_grads(step);
      opt3->step(fresh.params(), schedule.lr(5 + opt3->step_count()));
    }
    CHECK_FALSE(same_bits(fresh.weight.value, run.weight.value));
  }
}

TEST_CASE("state() lists the hyperparameters, the step count and the bound parameters", "[optim]") {
  auto opt = gradscale::make_optimizer({{"name", "adam"}, {"beta1", 0.85}});
  TinyModel model;
  CHECK(opt->state()["step"] == 0);
  CHECK(opt->state()["parameters"].empty());
  CHECK(opt->state_tensors().empty());
  model.set_grads(1);
  opt->step(model.params(), 1e-3);
  const json s = opt->state();
  CHECK(s["step"] == 1);
  CHECK(s["optimizer"]["beta1"] == 0.85);
  CHECK(s["optimizer"]["eps"] == 1e-8);
  CHECK(s["parameters"] ==
        json::array({{{"name", "fc1.weight"}, {"shape", {3, 4}}}, {{"name", "fc1.bias"}, {"shape", {4}}}}));
  std::vector<std::string> keys;
  for (const auto& st : opt->state_tensors()) keys.push_back(st.first);
  CHECK(keys == std::vector<std::string>{"fc1.weight/exp_avg", "fc1.weight/exp_avg_sq", "fc1.bias/exp_avg",
                                         "fc1.bias/exp_avg_sq"});
  // The tensors are owned by the optimizer and stay where they are across steps.
  const Tensor* first = opt->state_tensors()[0].second;
  model.set_grads(2);
  opt->step(model.params(), 1e-3);
  CHECK(opt->state_tensors()[0].second == first);
}

TEST_CASE("restoring onto other parameters or another configuration names what differs", "[optim]") {
  TinyModel model;
  auto opt = gradscale::make_optimizer({{"name", "sgd"}, {"momentum", 0.9}});
  model.set_grads(1);
  opt->step(model.params(), 0.1);
  const json state = opt->state();

  auto fresh = [] { return gradscale::make_optimizer({{"name", "sgd"}, {"momentum", 0.9}}); };
  {
    TinyModel other;
    other.bias.name = "fc2.bias";
    CHECK_THROWS_AS(fresh()->restore_state(state, other.params()), ConfigError);
    CHECK_THROWS_WITH(fresh()->restore_state(state, other.params()), Catch::Contains("'fc2.bias'"));
  }
  {
    TinyModel other;
    other.weight = make_param("fc1.weight", {4, 3}, std::vector<float>(12, 0.0f));
    CHECK_THROWS_WITH(fresh()->restore_state(state, other.params()), Catch::Contains("'fc1.weight'") &&
                                                                         Catch::Contains("[3, 4]") &&
                                                                         Catch::Contains("[4, 3]"));
  }
  {
    TinyModel other;
    Parameter extra = make_param("fc2.weight", {2}, {0, 0});
    CHECK_THROWS_WITH(fresh()->restore_state(state, {&other.weight, &other.bias, &extra}),
                      Catch::Contains("'fc2.weight'") && Catch::Contains("not in the checkpoint"));
    CHECK_THROWS_WITH(fresh()->restore_state(state, {&other.weight}),
                      Catch::Contains("'fc1.bias'") && Catch::Contains("not in the model"));
  }
  {
    auto other = gradscale::make_optimizer({{"name", "sgd"}, {"momentum", 0.8}});
    CHECK_THROWS_WITH(other->restore_state(state, model.params()), Catch::Contains("'momentum'"));
    auto adam = gradscale::make_optimizer("adam");
    CHECK_THROWS_WITH(adam->restore_state(state, model.params()),
                      Catch::Contains("\"sgd\"") && Catch::Contains("'adam'"));
  }
  {
    json broken = state;
    broken.erase("step");
    CHECK_THROWS_WITH(fresh()->restore_state(broken, model.params()), Catch::Contains("'step'"));
    json corrupt = state;
    corrupt["parameters"][1]["shape"] = json::array({"4"});
    CHECK_THROWS_AS(fresh()->restore_state(corrupt, model.params()), ConfigError);
    CHECK_THROWS_WITH(fresh()->restore_state(corrupt, model.params()),
                      Catch::Contains("'fc1.bias'") && Catch::Contains("'shape'"));
  }
  // A failed restore leaves the optimizer as it was.
  auto target = fresh();
  TinyModel other;
  other.bias.name = "fc2.bias";
  CHECK_THROWS(target->restore_state(state, other.params()));
  CHECK(target->step_count() == 0);
  CHECK(target->state_tensors().empty());
}

TEST_CASE("step() checks its parameters and changes nothing when it throws", "[optim]") {
  auto opt = gradscale::make_optimizer({{"name", "adam"}});
  TinyModel model;
  model.set_grads(1);
  CHECK_THROWS_AS(opt->step(model.params(), -0.1), ConfigError);
  CHECK_THROWS_AS(opt->step(model.params(), NAN), ConfigError);
  CHECK(opt->step_count() == 0);

  opt->step(model.params(), 1e-3);
  const TinyModel before = model;
  model.bias.grad = Tensor({5});
  CHECK_THROWS_AS(opt->step(model.params(), 1e-3), gradscale::ShapeError);
  CHECK_THROWS_WITH(opt->step(model.params(), 1e-3), Catch::Contains("'fc1.bias'"));
  CHECK(same_bits(model.weight.value, before.weight.value));  // the valid first parameter was not touched
  CHECK(opt->step_count() == 1);

  model.bias.grad = Tensor({4});
  Parameter renamed = model.bias;
  renamed.name = "fc9.bias";
  CHECK_THROWS_WITH(opt->step({&model.weight, &renamed}, 1e-3), Catch::Contains("'fc9.bias'"));
  CHECK_THROWS_WITH(opt->step({&model.weight}, 1e-3), Catch::Contains("1 parameters"));
  CHECK(opt->step_count() == 1);
}

TEST_CASE("updates do not depend on the number of threads", "[optim]") {
  const int saved_threads = omp_get_max_threads();
  for (const json& cfg : stateful_configs()) {
    CAPTURE(cfg.dump());
    std::vector<Tensor> results;
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const std::int64_t n = 200003;  // above the parallel threshold, not a multiple of the thread count
      Parameter p = make_param("w", {n}, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
      fill_grad(p.value, 0, 3);
      auto opt = gradscale::make_optimizer(cfg);
      for (int step = 1; step <= 3; ++step) {
        fill_grad(p.grad, step, 0);
        opt->step({&p}, 0.01);
      }
      results.push_back(p.value);
    }
    CHECK(same_bits(results[0], results[1]));
    CHECK(same_bits(results[0], results[2]));
  }
  omp_set_num_threads(saved_threads);
}

// ---------------------------------------------------------------------------------------------------
// Configuration.

TEST_CASE("make_optimizer fills PyTorch's defaults and round-trips its config", "[optim]") {
  CHECK(gradscale::make_optimizer("sgd")->config() ==
        json{{"name", "sgd"}, {"momentum", 0.0}, {"nesterov", false}, {"weight_decay", 0.0}});
  CHECK(gradscale::make_optimizer("adam")->config() ==
        json{{"name", "adam"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.0}});
  CHECK(gradscale::make_optimizer({{"name", "adamw"}})->config()["weight_decay"] == 0.01);
  for (const json& cfg : stateful_configs()) {
    const json resolved = gradscale::make_optimizer(cfg)->config();
    CHECK(gradscale::make_optimizer(resolved)->config() == resolved);
  }
}

TEST_CASE("optimizer config errors name the key and the allowed range", "[optim]") {
  using Catch::Contains;
  auto err = [](const json& cfg) {
    try {
      gradscale::make_optimizer(cfg);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err({{"name", "rmsprop"}}), Contains("'rmsprop'") && Contains("sgd, adam, adamw"));
  CHECK_THAT(err({{"momentum", 0.9}}), Contains("'name'"));
  CHECK_THAT(err({{"name", 3}}), Contains("'name'"));
  CHECK_THAT(err({{"name", "sgd"}, {"momentum", 1.0}}), Contains("'momentum'") && Contains("[0, 1)"));
  CHECK_THAT(err({{"name", "sgd"}, {"momentum", "0.9"}}), Contains("'momentum'"));
  CHECK_THAT(err({{"name", "sgd"}, {"nesterov", true}}), Contains("'nesterov'") && Contains("'momentum'"));
  CHECK_THAT(err({{"name", "sgd"}, {"nesterov", 1}}), Contains("'nesterov'") && Contains("true or false"));
  CHECK_THAT(err({{"name", "sgd"}, {"weight_decay", -1e-4}}),
             Contains("'weight_decay'") && Contains("[0, inf)"));
  CHECK_THAT(err({{"name", "sgd"}, {"lr", 0.1}}), Contains("unknown key 'lr'"));
  CHECK_THAT(err({{"name", "adam"}, {"beta1", -0.5}}), Contains("'beta1'") && Contains("[0, 1)"));
  CHECK_THAT(err({{"name", "adam"}, {"beta2", 1}}), Contains("'beta2'") && Contains("[0, 1)"));
  CHECK_THAT(err({{"name", "adam"}, {"eps", 0}}), Contains("'eps'") && Contains("(0, inf)"));
  CHECK_THAT(err({{"name", "adamw"}, {"weight_decay", -1}}), Contains("'weight_decay'"));
  CHECK_THAT(err({{"name", "adam"}, {"amsgrad", true}}),
             Contains("unknown key 'amsgrad'") && Contains("beta1"));
  CHECK_THAT(err({{"name", "adam"}, {"momentum", 0.9}}), Contains("unknown key 'momentum'"));
  CHECK_THROWS_WITH(Sgd(Sgd::Options{-0.1, false, 0.0}), Contains("'momentum'"));
  CHECK_THROWS_WITH(Adam(Adam::Options{0.9, 0.999, -1.0, 0.0, false}), Contains("'eps'"));
}

// ---------------------------------------------------------------------------------------------------
// LR schedules. Values are computed in double from the closed forms; the tolerance allows a few double
// roundings (and cos's error of about one ulp).

namespace {
Approx near(double x) {
  return Approx(x).epsilon(8 * DBL_EPSILON).margin(0.0);
}
}  // namespace

TEST_CASE("constant schedule, with and without warm-up", "[optim]") {
  const auto s = LrSchedule::from_json({{"name", "constant"}, {"lr", 0.1}});
  CHECK(s.lr(0) == 0.1);
  CHECK(s.lr(123456) == 0.1);
  const auto w = LrSchedule::from_json({{"name", "constant"}, {"lr", 0.1}, {"warmup_steps", 4}});
  CHECK(w.lr(0) == near(0.1 / 3.0));  // torch LinearLR's default start factor 1/3
  CHECK(w.lr(2) == near(0.1 * (1.0 / 3.0 + (2.0 / 3.0) * 0.5)));
  CHECK(w.lr(4) == 0.1);
  CHECK_THROWS_AS(s.lr(-1), gradscale::Error);
}

TEST_CASE("step schedule: boundaries every step_size applied steps, after the warm-up", "[optim]") {
  const auto s = LrSchedule::from_json({{"name", "step"}, {"lr", 0.1}, {"step_size", 3}, {"gamma", 0.5}});
  CHECK(s.lr(0) == 0.1);
  CHECK(s.lr(2) == 0.1);
  CHECK(s.lr(3) == 0.05);  // gamma = 1/2 scales exactly
  CHECK(s.lr(5) == 0.05);
  CHECK(s.lr(6) == 0.025);
  const auto w = LrSchedule::from_json({{"name", "step"},
                                        {"lr", 0.8},
                                        {"step_size", 3},
                                        {"gamma", 0.5},
                                        {"warmup_steps", 4},
                                        {"warmup_start_factor", 0.25}});
  CHECK(w.lr(0) == near(0.2));
  CHECK(w.lr(2) == near(0.5));
  CHECK(w.lr(3) == near(0.65));
  CHECK(w.lr(4) == 0.8);  // warm-up end: the full rate
  CHECK(w.lr(6) == 0.8);
  CHECK(w.lr(7) == 0.4);  // first boundary: warmup_steps + step_size
  CHECK(w.lr(10) == 0.2);
  CHECK(LrSchedule::from_json({{"name", "step"}, {"lr", 1.0}, {"step_size", 2}}).lr(2) == near(0.1));
}

TEST_CASE("cosine schedule: lr at the warm-up end, min_lr at total_steps and after", "[optim]") {
  const auto s = LrSchedule::from_json({{"name", "cosine"},
                                        {"lr", 1.0},
                                        {"min_lr", 0.1},
                                        {"total_steps", 10},
                                        {"warmup_steps", 2},
                                        {"warmup_start_factor", 0.5}});
  CHECK(s.lr(0) == near(0.5));
  CHECK(s.lr(1) == near(0.75));
  CHECK(s.lr(2) == 1.0);         // cos(0) = 1
  CHECK(s.lr(6) == near(0.55));  // halfway through the decay: the mean of lr and min_lr
  CHECK(s.lr(10) == 0.1);
  CHECK(s.lr(1000) == 0.1);  // stays at min_lr (torch's CosineAnnealingLR would rise again)
  for (int k = 2; k < 10; ++k) CHECK(s.lr(k + 1) < s.lr(k));
  const auto plain = LrSchedule::from_json({{"name", "cosine"}, {"lr", 0.4}, {"total_steps", 4}});
  CHECK(plain.lr(0) == 0.4);
  CHECK(plain.lr(1) == near(0.4 * (1 + std::cos(std::acos(-1.0) / 4)) / 2));
  CHECK(plain.lr(4) == 0.0);
}

TEST_CASE("schedule config: defaults, round trip and errors naming the key", "[optim]") {
  using Catch::Contains;
  const auto s = LrSchedule::from_json({{"name", "cosine"}, {"lr", 0.1}, {"total_steps", 100}});
  CHECK(s.config() == json{{"name", "cosine"},
                           {"lr", 0.1},
                           {"total_steps", 100},
                           {"min_lr", 0.0},
                           {"warmup_steps", 0},
                           {"warmup_start_factor", 1.0 / 3.0}});
  CHECK(LrSchedule::from_json(s.config()).config() == s.config());
  auto err = [](const json& cfg) {
    try {
      LrSchedule::from_json(cfg);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err({{"name", "linear"}, {"lr", 0.1}}),
             Contains("'linear'") && Contains("constant, step, cosine"));
  CHECK_THAT(err({{"name", "constant"}}), Contains("missing key 'lr'"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", -1}}), Contains("'lr'") && Contains("[0, inf)"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", 0.1}, {"total_steps", 5}}),
             Contains("unknown key 'total_steps'"));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}}), Contains("missing key 'step_size'"));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}, {"step_size", 0}}),
             Contains("'step_size'") && Contains("[1, "));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}, {"step_size", 2.5}}), Contains("'step_size'"));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}, {"step_size", 2}, {"gamma", 0}}),
             Contains("'gamma'") && Contains("(0, 1]"));
  CHECK_THAT(err({{"name", "cosine"}, {"lr", 0.1}, {"total_steps", 5}, {"warmup_steps", 5}}),
             Contains("'total_steps'") && Contains("'warmup_steps'"));
  CHECK_THAT(err({{"name", "cosine"}, {"lr", 0.1}, {"total_steps", 5}, {"min_lr", 0.2}}),
             Contains("'min_lr'") && Contains("[0, 0.1]"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", 0.1}, {"warmup_steps", -1}}), Contains("'warmup_steps'"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", 0.1}, {"warmup_start_factor", 0}}),
             Contains("'warmup_start_factor'") && Contains("(0, 1]"));
  CHECK(LrSchedule::from_json({{"name", "step"}, {"lr", 0.1}, {"step_size", 2.0}}).options().step_size == 2);
}
