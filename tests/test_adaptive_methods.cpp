// The per-layer controllers (SPEC §6, adaptive/) on hand-computed inputs: c, z and the power of two,
// approx_range, abs_range and element_wise against brute force, measured's choice and its overflow cap,
// bounds, update_every, φ, init_scale auto, per-layer overrides and the configuration errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "adaptive/math.h"
#include "adaptive/method.h"
#include "lib/core/random.h"
#include "lib/layers/linear.h"
#include "lib/layers/precision_ops.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/model/spec.h"
#include "lib/scaler/scaler.h"
#include "lib/train/trace.h"
#include "lib/train/trainer.h"
#include "tests/adaptive_fixtures.h"

using namespace gradscale;
using json = nlohmann::json;
using Catch::Matchers::Contains;
using namespace gradscale::test::adaptive_fixtures;

namespace {

// TensorStats with the given moments over `count` values (what tensor_moments would return).
TensorStats moments(double mean, double stddev, double mn, double mx, std::uint64_t count = 1000) {
  TensorStats s;
  s.elements = s.count = count;
  s.sum = mean * static_cast<double>(count);
  s.sum_squares = (stddev * stddev + mean * mean) * static_cast<double>(count);
  s.min = mn;
  s.max = mx;
  s.max_abs = std::max(-mn, mx);
  return s;
}

adaptive::MethodParams fp16_params(double n_uf = 1e-3) {
  adaptive::MethodParams p;
  p.n_uf = n_uf;
  p.c = adaptive::underflow_coefficient(n_uf);
  p.u_min = 0x1p-24;
  p.u_max = 65504;
  return p;
}

}  // namespace

TEST_CASE("adaptive math: c, z, erfinv and the power of two", "[adaptive]") {
  CHECK(adaptive::underflow_coefficient(1e-3) == Approx(1.2533e-3).epsilon(1e-4));
  CHECK(adaptive::normal_quantile_above(1e-3) == Approx(3.0902).epsilon(1e-4));
  for (double x : {-0.9, -0.3, 1e-6, 0.5, 0.999})
    CHECK(std::erf(adaptive::erfinv(x)) == Approx(x).epsilon(1e-14));
  CHECK(adaptive::power_of_two_floor(1.23) == 1.0);
  CHECK(adaptive::power_of_two_floor(0.23) == 0.125);
  CHECK(adaptive::power_of_two_floor(1024.0) == 1024.0);
  CHECK(adaptive::power_of_two_floor(0x1.fffffp-3) == 0.125);
}

TEST_CASE("approx_range on known moments", "[adaptive]") {
  const auto method = adaptive::make_approx_range();
  const adaptive::MethodParams p = fp16_params();
  LocalScaleQuery q;
  q.reduction = 64;
  // g: mean 0, std 1e-6, extremes ±4e-6; W: mean 0.01, std 0.05, extremes -0.2 .. 0.3.
  const TensorStats g = moments(0, 1e-6, -4e-6, 4e-6), w = moments(0.01, 0.05, -0.2, 0.3);
  q.grad_moments = &g;
  q.weight_moments = &w;
  const double sigma_o = std::sqrt((1e-12) * (0.05 * 0.05 + 0.01 * 0.01)) * std::sqrt(0.5 * 64);
  const double expect = std::max(0x1p-24 / (adaptive::underflow_coefficient(1e-3) * sigma_o), 1.0);
  CHECK(method->unbound_scale(q, p) == Approx(expect).epsilon(1e-9));
  // The overflow cap: large gradients make (u_max/K)/o_max the binding term, below 1.
  const TensorStats big = moments(0, 100, -30000, 20000);
  q.grad_moments = &big;
  CHECK(method->unbound_scale(q, p) == Approx((65504.0 / 64) / (30000 * 0.3)).epsilon(1e-12));
  // An all-zero gradient: s = 1.
  const TensorStats zero = moments(0, 0, 0, 0);
  q.grad_moments = &zero;
  CHECK(method->unbound_scale(q, p) == 1.0);
  // The cast forms.
  const TensorStats lg = moments(0, 1e-5, -2e-5, 3e-5);
  CHECK(adaptive::approx_range_no_weight(lg, p) == Approx(0x1p-24 / (adaptive::underflow_coefficient(1e-3) * 1e-5)).epsilon(1e-12));
  LogMoments lm;
  lm.count = 10;
  lm.mean = std::log(1e-6);
  lm.stddev = 1.0;
  CHECK(adaptive::approx_range_lognormal(lm, 1e-3, p) ==
        Approx(0x1p-24 * std::exp(3.090232306167813 - std::log(1e-6))).epsilon(1e-6));
}

TEST_CASE("abs_range and element_wise on hand-computed ranges", "[adaptive]") {
  const adaptive::MethodParams p = fp16_params();
  LocalScaleQuery q;
  q.reduction = 8;
  TensorStats g = moments(0, 1, -0.5, 0.25), w = moments(0, 1, -2, 1);
  g.min_nonzero_abs = 1e-7;
  w.min_nonzero_abs = 1e-3;
  q.grad_moments = &g;
  q.weight_moments = &w;
  // o_min = 1e-10, o_max = 0.5·2 = 1: s = min(max(2^-24/8/1e-10, 1), 65504/8/1) = 74.5...
  CHECK(adaptive::make_abs_range()->unbound_scale(q, p) == Approx((0x1p-24 / 8) / 1e-10).epsilon(1e-12));
  ProductRange r;
  r.min_abs = 1e-9;
  r.max_abs = 4;
  q.products = &r;
  CHECK(adaptive::make_element_wise()->unbound_scale(q, p) == Approx(std::min(0x1p-24 / 1e-9, 65504.0 / 4 / 8)));
  r = ProductRange{};
  CHECK(adaptive::make_element_wise()->unbound_scale(q, p) == 1.0);  // no non-zero product
}

TEST_CASE("the product range equals brute-force enumeration for Linear and Conv2d", "[adaptive]") {
  Rng rng(3);
  auto sparse = [&](Tensor t) {  // zeros and a wide spread of magnitudes
    for (std::int64_t i = 0; i < t.size(); ++i) {
      const auto u = uniform_below(rng, 5);
      t[i] = u == 0 ? 0.0f : t[i] * std::ldexp(1.0f, static_cast<int>(uniform_below(rng, 30)) - 15);
    }
    return t;
  };
  SECTION("Linear: g [n, k] · W [k, m]") {
    const std::int64_t n = 5, k = 7, m = 4;
    const Tensor g = sparse(normal_tensor({n, k}, 1)), w = sparse(normal_tensor({k, m}, 2));
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < k; ++j)
        for (std::int64_t c = 0; c < m; ++c) {
          const double pr = std::fabs(static_cast<double>(g[i * k + j]) * w[j * m + c]);
          if (g[i * k + j] == 0 || w[j * m + c] == 0) continue;
          lo = std::min(lo, pr);
          hi = std::max(hi, pr);
        }
    const ProductRange r = dense_product_range(g.data(), n, k, w.data(), m);
    CHECK(r.min_abs == lo);
    CHECK(r.max_abs == hi);
  }
  SECTION("Conv2d: taps inside the input only (padding 1, stride 2)") {
    ConvGeometry geo;
    geo.n = 2;
    geo.in_channels = 3;
    geo.out_channels = 4;
    geo.kernel = 3;
    geo.stride = 2;
    geo.pad = 1;
    geo.h = 5;
    geo.w = 6;
    geo.ho = (geo.h + 2 - 3) / 2 + 1;
    geo.wo = (geo.w + 2 - 3) / 2 + 1;
    const Tensor g = sparse(normal_tensor({geo.n, geo.out_channels, geo.ho, geo.wo}, 3));
    const Tensor w = sparse(normal_tensor({geo.out_channels, geo.in_channels, 3, 3}, 4));
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (std::int64_t i = 0; i < geo.n; ++i)
      for (std::int64_t o = 0; o < geo.out_channels; ++o)
        for (std::int64_t oh = 0; oh < geo.ho; ++oh)
          for (std::int64_t ow = 0; ow < geo.wo; ++ow)
            for (std::int64_t c = 0; c < geo.in_channels; ++c)
              for (std::int64_t ki = 0; ki < 3; ++ki)
                for (std::int64_t kj = 0; kj < 3; ++kj) {
                  const std::int64_t ih = oh * 2 - 1 + ki, iw = ow * 2 - 1 + kj;
                  if (ih < 0 || ih >= geo.h || iw < 0 || iw >= geo.w) continue;  // a padding tap
                  const float gv = g[((i * geo.out_channels + o) * geo.ho + oh) * geo.wo + ow];
                  const float wv = w[((o * geo.in_channels + c) * 3 + ki) * 3 + kj];
                  if (gv == 0 || wv == 0) continue;
                  const double pr = std::fabs(static_cast<double>(gv) * wv);
                  lo = std::min(lo, pr);
                  hi = std::max(hi, pr);
                }
    const ProductRange r = conv_product_range(g.data(), w.data(), geo);
    REQUIRE(hi > 0);
    CHECK(r.min_abs == lo);
    CHECK(r.max_abs == hi);
  }
}

TEST_CASE("measured picks the smallest power of two meeting n_uf and never overflows", "[adaptive]") {
  const auto method = adaptive::make_measured();
  const adaptive::MethodParams p = fp16_params(1e-2);
  LocalScaleQuery q;
  q.format = Format::fp16;
  auto choose = [&](const std::vector<float>& o) {
    const TensorStats s = tensor_stats(o.data(), o.size(), Format::fp16);
    q.upstream_stats = &s;
    return method->unbound_scale(q, p);
  };
  // 1000 values: 980 at 2^-10, 20 (2%) at 2^-30. 2% > 1% must be lifted to binade -24: s = 2^6.
  std::vector<float> o(1000, 0x1p-10f);
  for (int i = 0; i < 20; ++i) o[static_cast<std::size_t>(i)] = 0x1p-30f;
  CHECK(choose(o) == 64.0);
  // Only 1% underflowing is allowed as is: s = 1.
  for (int i = 10; i < 20; ++i) o[static_cast<std::size_t>(i)] = 0x1p-10f;
  CHECK(choose(o) == 1.0);
  // The straddling binade counts as underflow: values in [2^-25, 2^-24) need one more doubling.
  std::vector<float> st(100, 0x1.8p-25f);
  CHECK(choose(st) == 2.0);
  // The cap: max|s·o| ≤ 65504·2^-4 even when that leaves underflow.
  std::vector<float> wide(100, 0x1p-40f);
  wide[0] = 1000.0f;
  CHECK(choose(wide) == Approx(65504.0 / 16 / 1000.0));
  // Adversarial: heavy tails at random; the chosen scale never makes anything overflow.
  Rng rng(9);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> v(257);
    for (float& x : v)
      x = static_cast<float>(standard_normal(rng) * std::ldexp(1.0, static_cast<int>(uniform_below(rng, 60)) - 40));
    const double s = adaptive::power_of_two_floor(choose(v));
    for (float x : v) {
      const float y = quantize(static_cast<float>(s) * x, Format::fp16);
      REQUIRE(std::isfinite(y));
      REQUIRE(std::fabs(static_cast<double>(s) * x) <= 65504.0 / 16);
    }
  }
}

TEST_CASE("bounds are relative to S_in and apply to every method", "[adaptive]") {
  for (const char* method : {"fixed", "approx_range", "measured"}) {
    INFO(method);
    auto s = adaptive_scaler({{"method", method}, {"fixed_scale", 1e6}, {"n_uf", 0.4}, {"u_min", 1e-3}});
    LayerController* c = s->layer_controller();
    REQUIRE(c != nullptr);
    const std::vector<float> g(64, 1e-6f), w(64, 1e-6f), up(64, 1e-6f);
    const TensorStats gm = tensor_moments(g.data(), g.size()), wm = tensor_moments(w.data(), w.size());
    const TensorStats us = tensor_stats(up.data(), up.size(), Format::fp16);
    LocalScaleQuery q;
    q.reduction = 8;
    q.grad_moments = &gm;
    q.weight_moments = &wm;
    q.upstream_stats = &us;
    for (int layer = 0; layer < 3; ++layer) {
      c->begin_step(StepBegin{0, 1.0});
      q.layer_id = layer;
      q.scale_in = layer == 0 ? 1.0 : layer == 1 ? 256.0 : 4096.0;
      const LocalScale d = c->decide(q);
      CHECK(d.unbound > 16);  // every method wants far more than the bounds allow here
      const double expect = layer == 0 ? 16.0 : layer == 1 ? 4.0 : 0.25;  // min(16, 1024 / S_in)
      CHECK(d.s == expect);
    }
  }
}

TEST_CASE("update_every recomputes the statistics every N steps and reuses the cached s", "[adaptive]") {
  auto s = adaptive_scaler({{"method", "approx_range"}, {"update_every", 3}});
  s->bind({LayerInfo{0, "fc", "linear", true, 8, {8, 8}}}, Format::fp16);
  LayerController* c = s->layer_controller();
  std::vector<double> unbound;
  std::vector<bool> asked;
  for (int step = 0; step < 7; ++step) {
    s->begin_step(step);
    asked.push_back(c->needs(0) != 0);
    const TensorStats g = moments(0, 1e-6 * (step + 1), -1e-5, 1e-5), w = moments(0, 0.1, -0.5, 0.5);
    LocalScaleQuery q;
    q.layer_id = 0;
    q.reduction = 8;
    if (asked.back()) {
      q.grad_moments = &g;
      q.weight_moments = &w;
    }
    unbound.push_back(c->decide(q).unbound);
  }
  CHECK(asked == std::vector<bool>{true, false, false, true, false, false, true});
  CHECK(unbound[1] == unbound[0]);
  CHECK(unbound[2] == unbound[0]);
  CHECK(unbound[3] != unbound[0]);
  CHECK(unbound[4] == unbound[3]);
  CHECK(unbound[6] != unbound[3]);
}

TEST_CASE("phi halves on a forced overflow and recovers after recover_every clean steps", "[adaptive]") {
  auto s = adaptive_scaler({{"method", "fixed"}, {"init_scale", 64}, {"recover_every", 3}});
  CHECK(s->loss_scale() == 64);
  StepStatistics inf;
  inf.found_inf = true;
  CHECK(s->update(inf).skipped);
  CHECK(s->loss_scale() == 32);
  CHECK(s->update(inf).state["phi"] == 0.25);
  CHECK(s->loss_scale() == 16);
  for (int i = 0; i < 2; ++i) CHECK_FALSE(s->update(StepStatistics{}).skipped);
  CHECK(s->loss_scale() == 16);
  s->update(StepStatistics{});  // the third clean step
  CHECK(s->loss_scale() == 32);
  for (int i = 0; i < 9; ++i) s->update(StepStatistics{});
  CHECK(s->loss_scale() == 64);  // φ never exceeds 1
  // State round trip, mid-interval.
  s->update(inf);
  s->update(StepStatistics{});
  auto t = adaptive_scaler({{"method", "fixed"}, {"init_scale", 64}, {"recover_every", 3}});
  t->restore_state(s->state());
  CHECK(t->state() == s->state());
  CHECK_THROWS_WITH(t->restore_state(json{{"phi", 3}, {"clean_steps", 0}, {"last_loss_scale", 1}, {"layers", json::array()}}),
                    Contains("phi"));
}

TEST_CASE("adaptive configuration errors name the key and the range", "[adaptive]") {
  auto error_of = [](json cfg) {
    cfg["policy"] = "adaptive";
    try {
      make_scaler(cfg, Format::fp16);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of({{"method", "magic"}}), Contains("unknown method 'magic'") && Contains("measured"));
  CHECK_THAT(error_of({{"n_uf", 0.7}}), Contains("n_uf"));
  CHECK_THAT(error_of({{"update_every", 0}}), Contains("update_every"));
  CHECK_THAT(error_of({{"init_scale", "big"}}), Contains("init_scale") && Contains("auto"));
  CHECK_THAT(error_of({{"init_scale", -1}}), Contains("init_scale"));
  CHECK_THAT(error_of({{"scale_upper_bound", 0}}), Contains("scale_upper_bound"));
  CHECK_THAT(error_of({{"cast_form", "x"}}), Contains("cast_form"));
  CHECK_THAT(error_of({{"nuf", 1e-3}}), Contains("nuf"));
  CHECK_THAT(error_of({{"u_min", 2}, {"u_max", 1}}), Contains("u_min"));
}

TEST_CASE("init_scale auto chooses S0 from the fp32 loss gradient with each cast form", "[adaptive]") {
  // A loss gradient like softmax − onehot over N = 4: one −(1−p)/N per row, small positives elsewhere.
  std::vector<float> g = {-0.2f, 1e-6f, 2e-7f, 3e-6f, 5e-8f, -0.24f, 1e-7f, 4e-6f};
  QueryStatistics stats;
  LocalScaleQuery q;
  q.layer_id = -1;
  q.format = Format::fp16;
  q.grad = q.upstream = g.data();
  q.grad_size = q.upstream_size = static_cast<std::int64_t>(g.size());
  for (const char* form : {"no_weight", "lognormal", "measured"}) {
    INFO(form);
    auto s = adaptive_scaler({{"init_scale", "auto"}, {"cast_form", form}, {"n_uf", 0.1}});
    LocalScaleQuery query = q;
    stats.attach(s->loss_needs(), query, RoundOptions{});
    const double s0 = s->choose_loss_scale(query);
    CHECK(s->loss_scale() == s0);
    CHECK(adaptive::power_of_two_floor(s0) == s0);
    if (std::string(form) == "measured") {
      // Smallest 2^e with at most 10% of the 8 values (0 of them) in binades below 2^-24: the smallest,
      // 5e-8 (binade -25), needs e = 1; the cap 65504/16/0.24 is far away.
      CHECK(s0 == 2.0);
    }
    if (std::string(form) == "no_weight") {
      // The no-weight form, never below the floor of SPEC §6.5: measured's rule, 2 here.
      const TensorStats m = tensor_moments(g.data(), g.size());
      CHECK(s0 == std::max(2.0, adaptive::power_of_two_floor(adaptive::approx_range_no_weight(m, fp16_params(0.1)))));
    }
  }
}

TEST_CASE("per-layer overrides: a layer's own keys, a fixed scale, the global scale, in config(), refused when wrong",
          "[adaptive]") {
  auto s = adaptive_scaler({{"method", "fixed"},
                            {"fixed_scale", 4},
                            {"layers", {{"emb", "global"}, {"head", {{"fixed_scale", 2}}},
                                        {"mid", {{"method", "measured"}, {"scale_upper_bound", 8}}}}}});
  const std::vector<LayerInfo> layers = {LayerInfo{0, "emb", "linear", true, 8, {8, 8}},
                                         LayerInfo{1, "mid", "linear", true, 8, {8, 8}},
                                         LayerInfo{2, "fc", "linear", true, 8, {8, 8}},
                                         LayerInfo{3, "head", "linear", true, 8, {8, 8}}};
  s->bind(layers, Format::fp16);
  LayerController* c = s->layer_controller();
  s->begin_step(0);
  // mid's method is measured: it asks for the upstream histogram; emb (global) asks for nothing.
  CHECK(c->needs(0) == 0);
  CHECK(c->needs(1) == kNeedUpstreamStats);
  CHECK(c->needs(2) == 0);  // fixed reads nothing
  // An upstream product of magnitude 2^-30 underflows fp16: measured wants 2^7 or more, capped at 8 by its bound.
  std::vector<float> tiny(64, 0x1p-30f);
  TensorStats up = tensor_stats(tiny.data(), tiny.size(), Format::fp16);
  std::vector<double> s_of;
  for (int id = 0; id < 4; ++id) {
    LocalScaleQuery q;
    q.layer_id = id;
    q.reduction = 8;
    q.scale_in = 1;
    q.upstream_stats = &up;
    s_of.push_back(c->decide(q).s);
  }
  CHECK(s_of == std::vector<double>{1, 8, 4, 2});
  // The device rule of a global layer gives exactly 1 whatever S_in.
  const std::optional<ScaleRule> rule = c->device_rule(0);
  REQUIRE(rule);
  CHECK(rule->formula == ScaleRule::kFixed);
  CHECK(rule->params.fixed_scale == 1);
  CHECK(s->config().at("layers").at("emb") == "global");

  CHECK_THROWS_WITH(adaptive_scaler({{"layers", {{"head", {{"init_scale", 2}}}}}}),
                    Contains("'layers': 'head'") && Contains("init_scale"));
  CHECK_THROWS_WITH(adaptive_scaler({{"layers", {{"head", "local"}}}}), Contains("\"global\""));
  CHECK_THROWS_WITH(adaptive_scaler({{"layers", {{"head", {{"n_uf", 0.9}}}}}}), Contains("n_uf"));
  CHECK_THROWS_WITH(adaptive_scaler({{"layers", {{"head", {{"method", "nope"}}}}}}), Contains("unknown method"));
  auto unknown = adaptive_scaler({{"layers", {{"nope", "global"}}}});
  CHECK_THROWS_WITH(unknown->bind(layers, Format::fp16), Contains("'nope'") && Contains("emb, mid, fc, head"));
}
