// The device form of the controller contract (lib/scaler/scale_rule.h, LayerController::device_rule):
// evaluate_rule — the function lib/cuda's decision kernel runs — on the statistics of a query gives
// exactly the decision decide() gives on the host, and accept() leaves the controller in the state
// decide() would, for every method with a rule, with update_every caching, the bounds and the power of
// two. Also: the join's target T (lib/model/join_target.h, shared with the device join), and the host
// library's arithmetic is the unfused IEEE sequence the CUDA kernels repeat (no FMA contraction).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "lib/core/random.h"
#include "lib/instrument/histogram.h"
#include "lib/model/join.h"
#include "lib/optim/sgd.h"
#include "lib/scaler/scale_rule.h"
#include "lib/scaler/scaler.h"

using namespace gradscale;
using json = nlohmann::json;

namespace {

// Values spread over many binades around 2^center (some below fp16's subnormals), a few zeros.
std::vector<float> spread_values(std::size_t n, Rng& rng, int center) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int e = center - 8 + static_cast<int>(uniform_below(rng, 17));
    const double m = 1.0 + static_cast<double>(uniform_below(rng, 1u << 20)) / (1 << 20);
    v[i] = static_cast<float>((uniform_below(rng, 2) ? -1 : 1) * std::ldexp(m, e));
    if (uniform_below(rng, 50) == 0) v[i] = 0.0f;
  }
  return v;
}

std::vector<LayerInfo> two_layers() {
  std::vector<LayerInfo> layers(2);
  for (int i = 0; i < 2; ++i) {
    layers[static_cast<std::size_t>(i)].id = i;
    layers[static_cast<std::size_t>(i)].name = "fc" + std::to_string(i);
    layers[static_cast<std::size_t>(i)].kind = "linear";
    layers[static_cast<std::size_t>(i)].parametric = true;
    layers[static_cast<std::size_t>(i)].reduction = i == 0 ? 64 : 300;
  }
  return layers;
}

}  // namespace

TEST_CASE("A device rule decides exactly as decide() does, and accept() keeps the same state", "[adaptive][rule]") {
  const std::vector<json> configs = {
      {{"method", "approx_range"}},
      {{"method", "approx_range"}, {"update_every", 3}, {"scale_upper_bound", 1e6}, {"accum_upper_bound", 1e9}},
      {{"method", "abs_range"}},
      {{"method", "measured"}, {"n_uf", 1e-2}},
      {{"method", "measured"}, {"update_every", 2}, {"power_of_two", false}, {"margin", 2}},
      {{"method", "fixed"}, {"fixed_scale", 8}},
  };
  for (json cfg : configs) {
    cfg["policy"] = "adaptive";
    INFO(cfg.dump());
    const auto host = make_scaler(cfg, Format::fp16);
    const auto device = make_scaler(cfg, Format::fp16);
    LayerController& a = *host->layer_controller();
    LayerController& b = *device->layer_controller();
    a.bind(two_layers(), Format::fp16);
    b.bind(two_layers(), Format::fp16);
    Rng rng(7);
    int compared = 0, changes = 0;
    double last_unbound = -1;
    for (std::int64_t step = 0; step < 6; ++step) {
      host->begin_step(step);
      device->begin_step(step);
      for (int id = 0; id < 2; ++id) {
        INFO("step " << step << " layer " << id);
        const std::int64_t k = id == 0 ? 64 : 300;
        // Gradients around 2^-30..2^-18 (many underflow fp16 unscaled), weights around 2^-3.
        const std::vector<float> g = spread_values(512, rng, -30 + 4 * static_cast<int>(step % 4));
        const std::vector<float> w = spread_values(256, rng, -3);
        const std::vector<float> up = spread_values(400, rng, -22 + 3 * static_cast<int>(step % 5));
        const TensorStats gs = tensor_stats(g.data(), g.size(), Format::fp16);
        const TensorStats ws = tensor_stats(w.data(), w.size(), Format::fp16);
        const TensorStats us = tensor_stats(up.data(), up.size(), Format::fp16);
        const double scale_in = std::ldexp(1.0, static_cast<int>(uniform_below(rng, 14)));  // up to 2^13
        LocalScaleQuery q;
        q.layer_id = id;
        q.step = step;
        q.format = Format::fp16;
        q.scale_in = scale_in;
        q.reduction = k;
        const StatNeeds needs = a.needs(id);
        if (needs & kNeedGradMoments) q.grad_moments = &gs;
        if (needs & kNeedWeightMoments) q.weight_moments = &ws;
        if (needs & kNeedUpstreamStats) q.upstream_stats = &us;
        const LocalScale d = a.decide(q);

        std::optional<ScaleRule> rule = b.device_rule(id);
        REQUIRE(rule.has_value());
        rule->reduction = static_cast<double>(k);  // what the backend fills in
        RuleInputs in;
        in.grad = rule_moments(gs);
        in.weight = rule_moments(ws);
        in.upstream_bins = us.binades.data();
        in.upstream_nonzero = us.nonzero_finite();
        in.upstream_max_abs = us.max_abs;
        in.scale_in = scale_in;
        const RuleDecision e = evaluate_rule(*rule, in);
        b.accept(id, LocalScale{e.s, e.unbound});
        CHECK(std::memcmp(&e.s, &d.s, sizeof d.s) == 0);
        CHECK(std::memcmp(&e.unbound, &d.unbound, sizeof d.unbound) == 0);
        ++compared;
        changes += d.unbound != last_unbound;
        last_unbound = d.unbound;
      }
    }
    CHECK(compared == 12);
    if (cfg.at("method") != "fixed") CHECK(changes > 1);  // the inputs move the decision
    CHECK(host->state() == device->state());                 // accept() cached what decide() cached
  }
}

TEST_CASE("element_wise has no device rule when it is due: the host decides", "[adaptive][rule]") {
  const auto scaler = make_scaler(json{{"policy", "adaptive"}, {"method", "element_wise"}}, Format::fp16);
  LayerController& c = *scaler->layer_controller();
  c.bind(two_layers(), Format::fp16);
  scaler->begin_step(0);
  CHECK_FALSE(c.device_rule(0).has_value());
  // A global policy has no controller at all; a per-layer baseline keeps the default (none).
  CHECK(make_scaler(json{{"policy", "torch"}}, Format::fp16)->layer_controller() == nullptr);
}

TEST_CASE("The shared formulas: ceil(log2), the power of two and the join target on hand-worked values",
          "[adaptive][rule]") {
  CHECK(rule_ceil_log2(0x1p-24) == -24);
  CHECK(rule_ceil_log2(0x1.8p-24) == -23);
  CHECK(rule_ceil_log2(1.0) == 0);
  CHECK(rule_ceil_log2(std::nextafter(1.0, 2.0)) == 1);
  CHECK(rule_power_of_two_floor(3.0) == 2.0);
  CHECK(rule_power_of_two_floor(0x1p-1000) == 0x1p-1000);
  // T: the largest S_i with 2·m·T < 65504; m = max(3/4, 1/64) = 0.75: both fit, T = 64.
  CHECK(join_target_scale({3.0, 1.0}, {4.0, 64.0}, Format::fp16) == 64.0);
  // m = max(4000/4, 1/64) = 1000: 4 fits (8000), 64 does not (128000): T = 4.
  CHECK(join_target_scale({4000.0, 1.0}, {4.0, 64.0}, Format::fp16) == 4.0);
  // Nothing fits (m = 10000): min S_i halved until it does: T = 2.
  CHECK(join_target_scale({40000.0, 1.0}, {4.0, 64.0}, Format::fp16) == 2.0);
  // A non-finite part: min S_i.
  CHECK(join_target_scale({INFINITY, 1.0}, {4.0, 64.0}, Format::fp16) == 4.0);
}

TEST_CASE("The host library does not fuse a·b + c: its SGD step is the CUDA kernel's unfused sequence",
          "[optim][rule]") {
  // lib/cuda's kernels are compiled without FMA contraction (--fmad=false) and repeat the CPU loops
  // operation by operation; the CPU library must not contract either (CMakeLists.txt: -ffp-contract=off),
  // or GPU and CPU differ in the last bit wherever lr·d is inexact.
  Rng rng(3);
  const std::int64_t n = 4096;
  Parameter p;
  p.name = "w";
  p.value = Tensor({n});
  p.grad = Tensor({n});
  for (std::int64_t i = 0; i < n; ++i) {
    p.value[i] = static_cast<float>(1.0 + static_cast<double>(uniform_below(rng, 1u << 23)) / (1 << 23));
    p.grad[i] = static_cast<float>(static_cast<double>(uniform_below(rng, 1u << 23)) / (1 << 23) - 0.5);
  }
  const Tensor w0 = p.value, g = p.grad;
  const float lr = 0.1f;
  Sgd opt(Sgd::Options{});
  opt.step({&p}, 0.1);
  int fused_differs = 0, mismatches = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    volatile float product = lr * g[i];  // rounded on its own: no contraction possible
    const float unfused = w0[i] - product;
    const float fused = std::fma(-lr, g[i], w0[i]);
    fused_differs += fused != unfused;
    mismatches += std::memcmp(&p.value[i], &unfused, sizeof unfused) != 0;
  }
  REQUIRE(fused_differs > 0);  // the inputs tell the two apart
  CHECK(mismatches == 0);
}

TEST_CASE("measured_unbound walks e in one pass over the bins: the direct sum's e at every threshold",
          "[adaptive][rule]") {
  // The definition, summed anew for each e (SPEC §6.3): the smallest e ≥ 0 with Σ_{b < safe_from − e}
  // bins[b] ≤ nonzero·n_uf, or the e that leaves no binade below the threshold.
  const auto direct = [](const std::uint64_t* bins, std::uint64_t nonzero, const ScaleRuleParams& p) {
    const int safe_from = rule_ceil_log2(p.u_min);
    const double allowed = static_cast<double>(nonzero) * p.n_uf;
    int e = 0;
    for (;; ++e) {
      std::uint64_t under = 0;
      for (int b = kBinadeMin; b < safe_from - e && b <= kBinadeMax; ++b) under += bins[b - kBinadeMin];
      if (static_cast<double>(under) <= allowed || safe_from - e <= kBinadeMin) break;
    }
    return std::ldexp(1.0, e);
  };
  Rng rng(41);
  int above_one = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::array<std::uint64_t, kBinadeCount> bins{};
    // Values crowded around a random binade (gradients), sometimes spread over all of them, sometimes
    // in the lowest binade or above every threshold.
    const int kind = static_cast<int>(uniform_below(rng, 4));
    const int center = kBinadeMin + static_cast<int>(uniform_below(rng, kBinadeCount));
    const int count = 1 + static_cast<int>(uniform_below(rng, 400));
    for (int i = 0; i < count; ++i) {
      int b = kind == 0   ? kBinadeMin + static_cast<int>(uniform_below(rng, kBinadeCount))
              : kind == 1 ? kBinadeMin
                          : center - 6 + static_cast<int>(uniform_below(rng, 13));
      b = std::clamp(b, kBinadeMin, kBinadeMax);
      bins[static_cast<std::size_t>(b - kBinadeMin)] += 1 + uniform_below(rng, 3);
    }
    std::uint64_t nonzero = 0;
    for (std::uint64_t c : bins) nonzero += c;
    ScaleRuleParams p;
    const double u_mins[] = {0x1p-24, 0x1p-17, 0x1p-149, 0x1p-133, 0x1p-9, 1.0, 0x1p20, 0.75 * 0x1p-24};
    p.u_min = u_mins[uniform_below(rng, 8)];
    const double n_ufs[] = {0.0, 1e-3, 0.01, 0.5, 1.0, 1e-7};
    p.n_uf = n_ufs[uniform_below(rng, 6)];
    p.u_max = 65504;
    INFO("trial " << trial << ", u_min " << p.u_min << ", n_uf " << p.n_uf);
    // max_abs 0: no headroom cap, so the result is 2^e itself.
    const double s = measured_unbound(bins.data(), nonzero, 0.0, p);
    REQUIRE(s == direct(bins.data(), nonzero, p));
    above_one += s > 1.0;
  }
  CHECK(above_one > 500);  // the walk moved in many of the cases, not only at e = 0
}
