// ExternalBackward: the precision model driven by another engine's backward (the PyTorch plug-in's
// core). Checked against the pieces it must agree with: S0 times the fp32 loss gradient rounded once,
// the controller's own decision on the same statistics, the SPEC §5 join target, the exact unscale of
// weight gradients, the verdict on an overflow, state that round-trips and refuses another model.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gradscale/gradscale.h>

#include "lib/model/join.h"
#include "tests/precision_fp16.h"

using namespace gradscale;
using gradscale::testing::fp16;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

std::vector<LayerInfo> two_linear_layers() {
  LayerInfo a{0, "fc1", "linear", true, 8, {8, 4}};
  LayerInfo b{1, "fc2", "linear", true, 3, {3, 8}};
  return {a, b};
}

}  // namespace

TEST_CASE("external backward: the loss gradient is multiplied by S0 in fp32 and rounded once", "[external]") {
  ExternalBackward eb(two_linear_layers(), fp16(), json("static:1024"));
  eb.begin_step();
  // 2^-30 underflows in fp16 at scale 1 but not at 1024 (2^-20 is a subnormal); 3e-5·1024 rounds.
  std::vector<float> g = {std::ldexp(1.0f, -30), 3e-5f, -0.5f, 0.0f};
  std::vector<float> want;
  for (float v : g) want.push_back(quantize(v * 1024.0f, Format::fp16));
  CHECK(eb.loss_gradient(g.data(), static_cast<std::int64_t>(g.size())) == 1024);
  CHECK(g == want);
  CHECK(g[0] != 0.0f);
  const StepResult r = eb.finish_step(0.25);
  CHECK_FALSE(r.skipped);
  CHECK(r.loss == 0.25);
  CHECK(r.loss_scale == 1024);
  CHECK(eb.steps() == 1);
}

TEST_CASE("external backward: a layer's local scale is the controller's decision on the same statistics",
          "[external]") {
  const json cfg = {{"policy", "adaptive"}, {"method", "measured"}};
  ExternalBackward eb(two_linear_layers(), fp16(), cfg);
  // The same controller, asked directly with the statistics of the same fp32 product.
  auto reference = make_scaler(cfg, Format::fp16);
  reference->bind(two_linear_layers(), Format::fp16);
  reference->begin_step(0);
  eb.begin_step(true);
  std::vector<float> upstream(16);
  for (std::size_t i = 0; i < upstream.size(); ++i) upstream[i] = std::ldexp(1.0f + 0.125f * float(i), -27 + int(i % 5));
  const std::vector<float> original = upstream;
  LocalScaleQuery q;
  q.layer_id = 1;
  q.format = Format::fp16;
  q.scale_in = 8;
  q.reduction = 3;
  q.upstream = original.data();
  q.upstream_size = 16;
  q.upstream_shape = {2, 8};
  const TensorStats stats = tensor_stats(original.data(), original.size(), Format::fp16);
  q.upstream_stats = &stats;
  const LocalScale want = reference->layer_controller()->decide(q);
  REQUIRE(want.s > 1);  // values near 2^-27 underflow in fp16 at s = 1: measured must raise them

  const double s = eb.upstream(1, upstream.data(), {2, 8}, nullptr, {}, nullptr, {}, 8);
  CHECK(s == want.s);
  for (std::size_t i = 0; i < upstream.size(); ++i)
    CHECK(upstream[i] == quantize(original[i] * static_cast<float>(want.s), Format::fp16));
  const std::vector<LayerScale> rows = eb.layer_scales();
  CHECK(rows[1].s == want.s);
  CHECK(rows[1].scale_in == 8);
  CHECK(rows[1].scale_out == 8 * want.s);
  CHECK(rows[1].recorded);
  CHECK_FALSE(rows[0].ran);
}

TEST_CASE("external backward: weight gradients are rounded, then divided by their own scale exactly",
          "[external]") {
  ExternalBackward eb(two_linear_layers(), fp16(), json("none"));
  eb.begin_step();
  std::vector<float> g = {3.0f * 64, 1e-9f * 64, -0.1f * 64};
  std::vector<float> want;
  for (float v : g) want.push_back(quantize(v, Format::fp16) / 64.0f);
  eb.weight_gradient(0, g.data(), 3, 64);
  CHECK(g == want);
  std::vector<float> free_param = {0.5f};
  eb.weight_gradient(-1, free_param.data(), 1, 2);  // a parameter of no layer
  CHECK(free_param[0] == 0.25f);
  CHECK_FALSE(eb.finish_step().skipped);
  // A scale below float32's normal range cannot be divided out: the step is skipped, not applied.
  eb.begin_step();
  std::vector<float> tiny = {1.0f};
  eb.weight_gradient(1, tiny.data(), 1, 1e-40);
  const StepResult r = eb.finish_step();
  CHECK(r.skipped);
  CHECK(r.first_nonfinite_layer == 1);
}

TEST_CASE("external backward: the join target is SPEC §5's, and the joined sum is rounded once", "[external]") {
  ExternalBackward eb(two_linear_layers(), fp16(), json("none"));
  const std::vector<double> max_abs = {30000, 1.0}, scales = {1, 1024};
  CHECK(eb.join_target(max_abs, scales) == join_target_scale(max_abs, scales, Format::fp16));
  CHECK(eb.join_target(max_abs, scales) == 1);  // 2·30000·1 < 65504; 1024 would overflow
  eb.begin_step(true);
  std::vector<float> sum = {1e-9f, 2.0f};
  eb.round_join(0, sum.data(), 2);
  CHECK(sum[0] == 0.0f);
  CHECK(sum[1] == 2.0f);
  CHECK(eb.monitor().records[0].has_joined_grad);
}

TEST_CASE("external backward: an overflow anywhere skips the step and backs the policy off", "[external]") {
  ExternalBackward eb(two_linear_layers(), fp16(), json("torch"));
  eb.begin_step();
  std::vector<float> g = {1.0f};
  CHECK(eb.loss_gradient(g.data(), 1) == 65536);
  std::vector<float> w = {1e6f};  // beyond fp16's 65504
  eb.weight_gradient(1, w.data(), 1, 65536);
  const StepResult r = eb.finish_step();
  CHECK(r.found_inf);
  CHECK(r.first_nonfinite_layer == 1);
  CHECK(r.skipped);
  CHECK(r.report.scale == 32768);
  // A parameter of no layer overflowing also skips.
  eb.begin_step();
  std::vector<float> p = {std::numeric_limits<float>::infinity()};
  eb.weight_gradient(-1, p.data(), 1, 1);
  CHECK(eb.finish_step().skipped);
}

TEST_CASE("external backward: state round-trips and is refused by another model or scaler", "[external]") {
  const json cfg = {{"policy", "adaptive"}, {"method", "approx_range"}, {"update_every", 3}};
  ExternalBackward a(two_linear_layers(), fp16(), cfg);
  for (int i = 0; i < 2; ++i) {
    a.begin_step();
    std::vector<float> up(8, 1e-6f), grad(3, 1e-3f), w(24, 0.25f);
    a.upstream(1, up.data(), {1, 8}, grad.data(), {1, 3}, w.data(), {3, 8}, 1);
    a.finish_step();
  }
  const json saved = a.state();
  ExternalBackward b(two_linear_layers(), fp16(), cfg);
  b.restore_state(saved);
  CHECK(b.state() == saved);
  CHECK(b.steps() == 2);

  std::vector<LayerInfo> other = two_linear_layers();
  other[1].name = "head";
  ExternalBackward c(other, fp16(), cfg);
  CHECK_THROWS_WITH(c.restore_state(saved), Contains("saved for the layers") && Contains("head"));
  ExternalBackward d(two_linear_layers(), fp16(), json("torch"));
  CHECK_THROWS_WITH(d.restore_state(saved), Contains("saved for the scaler"));
  CHECK_THROWS_WITH(d.restore_state(json::array()), Contains("expected an object"));
}

TEST_CASE("external backward: with the caller's graph, an overflow that is no layer's own is charged to its reader",
          "[external]") {
  // fc1's output is read by fc2: the gradient fc1 receives carries the scale fc2's s set. Without the
  // graph the overflow there is the loss scale's; with it, fc2's φ_l (SPEC §6.5).
  const json cfg = {{"policy", "adaptive"}, {"method", "fixed"}, {"fixed_scale", 4}, {"update_every", 3}};
  const auto overflow_at_fc1 = [](ExternalBackward& eb) {
    eb.begin_step();
    std::vector<float> g = {1e6f};
    eb.round_received(0, g.data(), 1);
    return eb.finish_step();
  };
  const auto state_of = [](const ExternalBackward& eb) { return eb.state()["scaler"]["state"]; };
  ExternalBackward without(two_linear_layers(), fp16(), cfg);
  overflow_at_fc1(without);
  CHECK(state_of(without)["phi"] == 0.5);

  ExternalBackward with(two_linear_layers(), fp16(), cfg);
  // A decision cached (update_every) before the graph is given is kept through the re-binding.
  with.begin_step();
  std::vector<float> up(8, 1e-3f), grad(3, 1e-3f), w(24, 0.25f);
  with.upstream(1, up.data(), {1, 8}, grad.data(), {1, 3}, w.data(), {3, 8}, 1);
  with.finish_step();
  const json before = with.state();
  with.set_layer_inputs({{-1}, {0}});
  CHECK(with.state() == before);
  CHECK(with.layers()[1].inputs == std::vector<int>{0});
  overflow_at_fc1(with);
  const json charged = state_of(with);
  CHECK(charged["phi"] == 1);
  const json& layers = charged["layers"];
  REQUIRE(layers.size() == 1);
  CHECK(layers[0]["id"] == 1);
  CHECK(layers[0]["phi"].get<double>() < 1);

  CHECK_THROWS_WITH(with.set_layer_inputs({{0}}), Contains("1 lists of inputs for 2 layers"));
  CHECK_THROWS_WITH(with.set_layer_inputs({{}, {2}}), Contains("'fc2' reads layer id 2"));
  with.begin_step();
  CHECK_THROWS_WITH(with.set_layer_inputs({{}, {0}}), Contains("inside an iteration"));
}

namespace {

// A reducer standing for the other ranks: the statistics every query reduces are summed with a copy of
// themselves (two ranks that hold the same rows), the maxima max-reduced with `other_max`; counts the calls.
class TwinRanks final : public StatisticsReducer {
 public:
  double other_max = 0;
  int stats = 0, maxima = 0;
  void reduce(TensorStats& s) override {
    ++stats;
    s.count *= 2;
    s.elements *= 2;
    s.normal *= 2;
    s.subnormal *= 2;
    s.underflow *= 2;
    s.zero *= 2;
    s.overflow *= 2;
    s.nonfinite *= 2;
    for (auto& b : s.binades) b *= 2;
    s.sum *= 2;
    s.sum_squares *= 2;
  }
  void reduce(LogMoments&) override { ++stats; }
  void reduce(ProductRange&) override { ++stats; }
  void reduce_max(double* values, std::size_t n) override {
    ++maxima;
    for (std::size_t i = 0; i < n; ++i) values[i] = std::max(values[i], other_max);
  }
  void reduce_sum(float*, std::size_t) override { FAIL("weight gradients are not summed by ExternalBackward"); }
};

}  // namespace

TEST_CASE("external backward: with a reducer, S0, local scales and join targets come from the reduced statistics",
          "[external]") {
  const json cfg = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}};
  ExternalBackward one(two_linear_layers(), fp16(), cfg), two(two_linear_layers(), fp16(), cfg);
  TwinRanks twin;
  two.set_reducer(&twin);
  std::vector<float> up(8), grad(3, 1e-3f), w(24, 0.25f);
  for (std::size_t i = 0; i < up.size(); ++i) up[i] = std::ldexp(1.0f + static_cast<float>(i) / 8, -20 - static_cast<int>(i));
  std::vector<float> loss_grad = {1e-3f, -2e-4f, 5e-6f};
  for (ExternalBackward* eb : {&one, &two}) {
    eb->begin_step();
    std::vector<float> g = loss_grad, u = up;
    eb->loss_gradient(g.data(), 3);
    eb->upstream(1, u.data(), {1, 8}, grad.data(), {1, 3}, w.data(), {3, 8}, eb->loss_scale());
  }
  // Twice the same rows: the same fractions and maxima, so the same decisions as one process...
  CHECK(twin.stats >= 2);  // the loss gradient's statistics and fc2's query
  CHECK(two.loss_scale() == one.loss_scale());
  CHECK(two.layer_scales()[1].s == one.layer_scales()[1].s);
  // ...and a join whose parts are larger on the other rank takes the target that rank's maxima need.
  twin.other_max = 1e4;
  CHECK(two.join_target({1.0, 1.0}, {1024, 64}) == one.join_target({1e4, 1e4}, {1024, 64}));
  CHECK(two.join_target({1.0, 1.0}, {1024, 64}) != one.join_target({1.0, 1.0}, {1024, 64}));
  CHECK(twin.maxima == 2);
  two.set_reducer(nullptr);
  CHECK(two.join_target({1.0, 1.0}, {1024, 64}) == one.join_target({1.0, 1.0}, {1024, 64}));
  CHECK(twin.maxima == 2);
}

TEST_CASE("external backward: misuse is refused with what to do", "[external]") {
  CHECK_THROWS_WITH(ExternalBackward({}, fp16(), json("none")), Contains("layer table is empty"));
  std::vector<LayerInfo> bad = two_linear_layers();
  bad[1].reduction = 0;
  CHECK_THROWS_WITH(ExternalBackward(bad, fp16(), json("none")), Contains("reduction length"));
  CHECK_THROWS_WITH(ExternalBackward(two_linear_layers(), fp16(), json("no-such-policy")), Contains("no-such-policy"));
  ExternalBackward eb(two_linear_layers(), fp16(), json({{"policy", "adaptive"}, {"method", "approx_range"}}));
  std::vector<float> g = {1.0f};
  CHECK_THROWS_WITH(eb.loss_gradient(g.data(), 1), Contains("begin_step"));
  eb.begin_step();
  CHECK_THROWS_WITH(eb.weight_gradient(7, g.data(), 1, 1), Contains("layer id 7"));
  // approx_range reads the gradient the layer received and its weight: both must be given.
  CHECK_THROWS_WITH(eb.upstream(0, g.data(), {1}, nullptr, {}, nullptr, {}, 1), Contains("needs the gradient"));
}

TEST_CASE("external backward: ranks that sum their agreement buffers take one verdict", "[external]") {
  // Rank a overflows at layer 1, rank b is clean: after the sum both skip, naming layer 1.
  ExternalBackward a(two_linear_layers(), fp16(), json("torch")), b(two_linear_layers(), fp16(), json("torch"));
  a.begin_step();
  b.begin_step();
  std::vector<float> big = {1e6f}, small = {1.0f};
  a.weight_gradient(1, big.data(), 1, 1);
  b.weight_gradient(1, small.data(), 1, 1);
  std::vector<double> sum = a.agreement_buffer();
  const std::vector<double> other = b.agreement_buffer();
  REQUIRE(sum.size() == 6);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += other[i];
  a.agree(sum);
  b.agree(sum);
  const StepResult ra = a.finish_step(), rb = b.finish_step();
  CHECK(ra.skipped);
  CHECK(rb.skipped);
  CHECK(rb.first_nonfinite_layer == 1);
  CHECK(a.state() == b.state());
  b.begin_step();
  CHECK_THROWS_WITH(b.agree({1.0}), Contains("expected 6"));
}

TEST_CASE("external backward: a rounded copy is the in-place rounding's bits and leaves its source",
          "[external]") {
  ExternalBackward eb(two_linear_layers(), fp16(), json("torch"));
  const std::vector<float> src = {0.0f, -0.0f, 1.0f / 3, 70000.0f, 1e-8f, -2.5e-6f, 65519.0f, 3.14159f};
  std::vector<float> in_place = src;
  eb.arrays().quantize(in_place.data(), in_place.data(), in_place.size(), Format::fp16, RoundOptions{});
  std::vector<float> copy(src.size(), 7.0f);
  const std::vector<float> before = src;
  eb.arrays().quantize(src.data(), copy.data(), src.size(), Format::fp16, RoundOptions{});
  for (std::size_t i = 0; i < src.size(); ++i) {
    INFO("value " << i);
    CHECK(std::signbit(copy[i]) == std::signbit(in_place[i]));
    CHECK((copy[i] == in_place[i] || (std::isnan(copy[i]) && std::isnan(in_place[i]))));
    CHECK(std::memcmp(&src[i], &before[i], sizeof(float)) == 0);
  }
  CHECK(copy[2] != src[2]);    // 1/3 is not an fp16 value
  CHECK(std::isinf(copy[3]));  // above fp16's largest
  eb.arrays().quantize(src.data(), copy.data(), src.size(), Format::fp32, RoundOptions{});
  CHECK(std::memcmp(copy.data(), src.data(), src.size() * sizeof(float)) == 0);  // fp32: a copy
}

TEST_CASE("external backward: the maxima of several arrays at once are each array's max_abs", "[external]") {
  ExternalBackward eb(two_linear_layers(), fp16(), json("torch"));
  const std::vector<float> a = {1.0f, -3.5f, 2.0f}, b = {-0.0f, 0.25f},
                           c = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  const float* const arrays[] = {a.data(), b.data(), nullptr, c.data()};
  const std::size_t sizes[] = {a.size(), b.size(), 0, c.size()};
  float out[4] = {-1, -1, -1, -1};
  eb.arrays().max_abs_each(arrays, sizes, 4, out);
  CHECK(out[0] == 3.5f);
  CHECK(out[1] == 0.25f);
  CHECK(out[2] == 0.0f);      // an empty array
  CHECK(std::isinf(out[3]));  // not finite: inf, as max_abs
  CHECK(out[3] == eb.arrays().max_abs(c.data(), c.size()));
}

TEST_CASE("external backward: each gradient step from a source gives the in-place step's bits, scales and rows",
          "[external]") {
  // Two identical backward objects: one rounds in place, the other reads a source it must leave as it is
  // and writes a separate array (the plug-in's one-pass rounded copy).
  for (const json& cfg : {json("torch"), json{{"policy", "adaptive"}, {"method", "measured"}},
                          json{{"policy", "adaptive"}, {"method", "approx_range"}, {"init_scale", "auto"}}}) {
    INFO("scaler " << cfg.dump());
    ExternalBackward in_place(two_linear_layers(), fp16(), cfg), copied(two_linear_layers(), fp16(), cfg);
    for (int step = 0; step < 3; ++step) {
      in_place.begin_step(true);
      copied.begin_step(true);
      auto values = [step](std::size_t n, int lo) {
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i)
          v[i] = std::ldexp(1.0f + 0.0625f * float(i % 16), lo + int((i * 7 + std::size_t(step)) % 20)) *
                 (i % 3 ? 1.0f : -1.0f);
        return v;
      };
      auto both = [](const std::vector<float>& source, auto&& call_in_place, auto&& call_copied) {
        std::vector<float> a = source, src = source, b(source.size(), 7.0f);
        const double ra = call_in_place(a.data()), rb = call_copied(src.data(), b.data());
        CHECK(ra == rb);
        CHECK(std::memcmp(src.data(), source.data(), source.size() * sizeof(float)) == 0);  // left as it is
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      };
      both(values(6, -8), [&](float* g) { return in_place.loss_gradient(g, 6); },
           [&](const float* s, float* g) { return copied.loss_gradient(s, g, 6); });
      const double scale_in = in_place.loss_scale();
      const std::vector<float> received = values(6, -30), weight = values(24, -6);
      both(values(16, -34),
           [&](float* g) {
             return in_place.upstream(1, g, {2, 8}, received.data(), {2, 3}, weight.data(), {3, 8}, scale_in);
           },
           [&](const float* s, float* g) {
             return copied.upstream(1, s, g, {2, 8}, received.data(), {2, 3}, weight.data(), {3, 8}, scale_in);
           });
      both(values(16, -30), [&](float* g) { in_place.round_received(0, g, 16); return 0.0; },
           [&](const float* s, float* g) { copied.round_received(0, s, g, 16); return 0.0; });
      for (int layer : {0, 1, -1})
        both(values(24, -40),
             [&](float* g) { in_place.weight_gradient(layer, g, 24, scale_in); return 0.0; },
             [&](const float* s, float* g) { copied.weight_gradient(layer, s, g, 24, scale_in); return 0.0; });
      const StepResult ra = in_place.finish_step(0.5), rb = copied.finish_step(0.5);
      CHECK(ra.skipped == rb.skipped);
      CHECK(ra.loss_scale == rb.loss_scale);
      CHECK(in_place.state() == copied.state());
      const std::vector<LayerScale> a = in_place.layer_scales(), b = copied.layer_scales();
      for (std::size_t l = 0; l < a.size(); ++l) {
        CHECK(a[l].s == b[l].s);
        CHECK(a[l].scale_out == b[l].scale_out);
        CHECK(a[l].unbound == b[l].unbound);
        CHECK(a[l].underflow_rate == b[l].underflow_rate);
        CHECK(in_place.monitor().records[l].weight_grad_scale == copied.monitor().records[l].weight_grad_scale);
        CHECK(in_place.monitor().records[l].sent_max_abs == copied.monitor().records[l].sent_max_abs);
      }
    }
  }
}

TEST_CASE("external backward: a scale handle outside the iteration's table is refused by name",
          "[external]") {
  Precision p = testing::fp16();
  std::vector<LayerInfo> layers = {{0, "fc", "linear", true, 4, {4, 4}}};
  ExternalBackward eb(layers, p, json("torch"));
  eb.begin_step();
  const ScaleHandle h = eb.scale_handle(8.0);
  CHECK(eb.scale_value(h) == 8.0);
  CHECK(eb.local_value(h) == 1.0);
  CHECK_THROWS_WITH(eb.scale_value(ScaleHandle{h.id + 1}),
                    Catch::Matchers::Contains("scale handle 1 is not in"));
  CHECK_THROWS_AS(eb.scale_handle(0.0), NumericError);
  eb.finish_step();
  CHECK(eb.scale_value(h) == 8.0);  // until the next begin_step
  eb.begin_step();
  CHECK_THROWS_WITH(eb.scale_value(h), Catch::Matchers::Contains("is not in this iteration's table"));
}

TEST_CASE("external backward: host arrays keep no scale table, and say so by name", "[external]") {
  ArrayOps& host = host_array_ops();
  CHECK_FALSE(host.keeps_scales());
  CHECK(host.max_join_parts() == 0);
  CHECK_THROWS_WITH(host.new_scale(2.0), Contains("ArrayOps::new_scale: these arrays keep no scale table"));
  float v[2] = {1.0f, 2.0f};
  CHECK_THROWS_WITH(host.divide_by_scale(v, 2, 0), Contains("ArrayOps::divide_by_scale"));
  CHECK_THROWS_WITH(host.queue_scale(0, [](const ScaleEntry&) {}), Contains("ArrayOps::queue_scale"));
  CHECK(v[1] == 2.0f);
  // ExternalBackward on the host never asks for one: its handles hold host values.
  std::vector<LayerInfo> layers = {{0, "fc", "linear", true, 2, {2, 2}}};
  ExternalBackward eb(layers, fp16(), json{{"policy", "adaptive"}, {"method", "measured"}});
  eb.begin_step();
  float g[4] = {0.5f, -0.25f, 0.125f, 1.0f};
  const ScaleHandle sent = eb.upstream(0, g, g, {2, 2}, nullptr, {}, nullptr, {}, eb.scale_handle(8.0));
  CHECK(eb.scale_value(sent) == 8.0 * eb.local_value(sent));
  CHECK(eb.host_waits() == 0);
}
