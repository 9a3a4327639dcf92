// Hand-worked sequences for every baseline policy (SPEC §7, docs/scalers.md): growth on the exact step,
// backoff, floors and ceilings, hysteresis with and without consecutive mode, growth that would
// overflow float32, raising at the minimum, the legacy DeepSpeed rule, and PopART's statistics rule.
// Every expected value was worked out by hand from the peer's update rule; scales are powers of two
// (exact) unless the test is about float32 rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/core/error.h"
#include "lib/instrument/histogram.h"
#include "lib/scaler/scaler.h"

using Catch::Matchers::Contains;
using gradscale::Format;
using gradscale::Scaler;
using gradscale::StepReport;
using gradscale::StepStatistics;
using nlohmann::json;

namespace {

std::unique_ptr<Scaler> make(const std::string& spec, Format f = Format::fp16) {
  return gradscale::make_scaler(std::string_view(spec), f);
}

// Runs F/I events; returns the reports.
std::vector<StepReport> run(Scaler& s, const std::string& events) {
  std::vector<StepReport> out;
  for (const char c : events) {
    StepStatistics st;
    st.found_inf = c == 'I';
    out.push_back(s.update(st));
  }
  return out;
}

std::vector<double> scales(const std::vector<StepReport>& reports) {
  std::vector<double> v;
  for (const auto& r : reports) v.push_back(r.scale);
  return v;
}

std::vector<bool> skips(const std::vector<StepReport>& reports) {
  std::vector<bool> v;
  for (const auto& r : reports) v.push_back(r.skipped);
  return v;
}

std::vector<json> counter(const std::vector<StepReport>& reports, const char* key) {
  std::vector<json> v;
  for (const auto& r : reports) v.push_back(r.state.at(key));
  return v;
}

// Steps `n` clean updates and returns the last report.
StepReport clean_steps(Scaler& s, int n) {
  StepReport last;
  for (int i = 0; i < n; ++i) last = s.update(StepStatistics{});
  return last;
}

StepReport stats_step(Scaler& s, std::uint64_t below, std::uint64_t above, bool found_inf = false) {
  StepStatistics st;
  st.found_inf = found_inf;
  st.grad_below_edge = below;
  st.grad_above_edge = above;
  return s.update(st);
}

constexpr double kTwo127 = 0x1p127;  // the largest power of two in float32

}  // namespace

TEST_CASE("none: scale 1, a found_inf step is skipped, no counters", "[scaler]") {
  auto s = make("none");
  const auto r = run(*s, "FIF");
  CHECK(scales(r) == std::vector<double>{1, 1, 1});
  CHECK(skips(r) == std::vector<bool>{false, true, false});
  CHECK(r[1].state == json::object());
}

TEST_CASE("static: constant scale, found_inf skips", "[scaler]") {
  auto s = make("static:1024");
  const auto r = run(*s, "IFI");
  CHECK(scales(r) == std::vector<double>{1024, 1024, 1024});
  CHECK(skips(r) == std::vector<bool>{true, false, true});
  // Kept in double: a value float32 cannot hold survives.
  CHECK(make("static:0.1")->loss_scale() == 0.1);
}

TEST_CASE("torch: growth after growth_interval clean steps, back-off on an overflow, on the exact step",
          "[scaler]") {
  auto s = make(R"({"policy":"torch","init_scale":4,"growth_interval":2,"backoff_factor":0.25})");
  const auto r = run(*s, "FFI");
  CHECK(scales(r) == std::vector<double>{4, 8, 2});
  CHECK(skips(r) == std::vector<bool>{false, false, true});
  CHECK(r[0].state == json{{"scale", 4.0}, {"growth_tracker", 1}});
  CHECK(r[1].state == json{{"scale", 8.0}, {"growth_tracker", 0}});
  CHECK(r[2].state == json{{"scale", 2.0}, {"growth_tracker", 0}});

  // Defaults: 2^16, grows by 2 on the 2000th consecutive clean step, not the 1999th.
  auto d = make("torch");
  CHECK(clean_steps(*d, 1999).state == json{{"scale", 65536.0}, {"growth_tracker", 1999}});
  CHECK(clean_steps(*d, 1).state == json{{"scale", 131072.0}, {"growth_tracker", 0}});
  // An overflow resets the tracker: 1999 clean, I, then 2000 more clean steps to grow.
  CHECK(run(*d, "I")[0].state == json{{"scale", 65536.0}, {"growth_tracker", 0}});
  CHECK(clean_steps(*d, 1999).scale == 65536.0);
  CHECK(clean_steps(*d, 1).scale == 131072.0);
}

TEST_CASE("torch: no floor, growth past float32 keeps the old scale", "[scaler]") {
  auto s = make(R"({"policy":"torch","init_scale":1})");
  CHECK(scales(run(*s, "III")) == std::vector<double>{0.5, 0.25, 0.125});

  auto top = make(R"({"policy":"torch","init_scale":1.7014118346046923e38,"growth_interval":1})");
  REQUIRE(top->loss_scale() == kTwo127);
  const auto r = run(*top, "FF");
  CHECK(scales(r) == std::vector<double>{kTwo127, kTwo127});
  CHECK(r[1].state.at("growth_tracker") == 0);
}

TEST_CASE("torch: products are formed in double and rounded once to float32", "[scaler]") {
  // PyTorch's kernel: scale = float(scale * backoff) with backoff a double. 0.1 is not a float32, so
  // the second backoff differs from the float32 product float(0.1f * 0.1f) (0x1.47ae16p-7, what
  // megatron gives below).
  auto s = make(R"({"policy":"torch","init_scale":1,"backoff_factor":0.1})");
  CHECK(scales(run(*s, "II")) == std::vector<double>{0x1.99999ap-4, 0x1.47ae14p-7});
  auto m = make(
      R"({"policy":"megatron","initial_scale":1,"backoff_factor":0.1,"min_scale":1e-30,"hysteresis":1})");
  CHECK(scales(run(*m, "II")) == std::vector<double>{0x1.99999ap-4, 0x1.47ae16p-7});
  // init_scale is rounded to float32 once, like torch.full((), init_scale, dtype=float32).
  CHECK(make(R"({"policy":"torch","init_scale":0.1})")->loss_scale() == static_cast<double>(0.1f));
}

TEST_CASE("deepspeed: hysteresis without consecutive mode", "[scaler]") {
  auto s = make(R"({"policy":"deepspeed","init_scale":1024,"scale_window":2,"hysteresis":2})");
  const auto r = run(*s, "IFIFFF");
  // I uses up one unit of hysteresis; the clean step does not refill it (only growth does), so the
  // second I lowers the scale; growth when stable = cur_iter - last_overflow_iter - 1 reaches 2.
  CHECK(scales(r) == std::vector<double>{1024, 1024, 512, 512, 512, 1024});
  CHECK(counter(r, "cur_hysteresis") == std::vector<json>{1, 1, 1, 1, 1, 2});
  CHECK(counter(r, "last_overflow_iter") == std::vector<json>{0, 0, 2, 2, 2, 2});
  CHECK(counter(r, "cur_iter") == std::vector<json>{1, 2, 3, 4, 5, 6});
  CHECK(skips(r) == std::vector<bool>{true, false, true, false, false, false});
}

TEST_CASE("deepspeed: consecutive hysteresis refills on every clean step", "[scaler]") {
  auto s = make(
      R"({"policy":"deepspeed","init_scale":1024,"scale_window":2,"hysteresis":2,"consecutive_hysteresis":true})");
  const auto r = run(*s, "IFIFFFII");
  CHECK(scales(r) == std::vector<double>{1024, 1024, 1024, 1024, 1024, 2048, 2048, 1024});
  CHECK(counter(r, "cur_hysteresis") == std::vector<json>{1, 2, 1, 2, 2, 2, 1, 1});
}

TEST_CASE("deepspeed: growth step of the current and the legacy rule", "[scaler]") {
  // From the start (last_overflow_iter = -1): the current rule grows on the 4th clean step of a
  // 3-step window, the legacy rule on the 3rd.
  auto current = make(R"({"policy":"deepspeed","init_scale":1,"scale_window":3})");
  CHECK(scales(run(*current, "FFFFFFF")) == std::vector<double>{1, 1, 1, 2, 2, 2, 4});
  auto legacy = make(R"({"policy":"deepspeed","init_scale":1,"scale_window":3,"legacy_growth":true})");
  CHECK(scales(run(*legacy, "FFFFFFF")) == std::vector<double>{1, 1, 2, 2, 2, 4, 4});
  // After an overflow: the current rule needs window + 1 clean steps, the legacy rule window.
  auto now2 = make(R"({"policy":"deepspeed","init_scale":4,"scale_window":2,"hysteresis":1})");
  CHECK(scales(run(*now2, "IFFF")) == std::vector<double>{2, 2, 2, 4});
  auto legacy2 =
      make(R"({"policy":"deepspeed","init_scale":4,"scale_window":2,"hysteresis":1,"legacy_growth":true})");
  CHECK(scales(run(*legacy2, "IFFF")) == std::vector<double>{2, 2, 4, 4});
  // Defaults: window 1000 -> the first growth is on clean step 1001.
  auto d = make("deepspeed");
  CHECK(clean_steps(*d, 1000).scale == 65536.0);
  CHECK(clean_steps(*d, 1).scale == 131072.0);
}

TEST_CASE("deepspeed: floor at min_scale, raising at the minimum", "[scaler]") {
  auto floor = make(R"({"policy":"deepspeed","init_scale":3,"min_scale":2,"hysteresis":1})");
  CHECK(scales(run(*floor, "I")) == std::vector<double>{2});

  auto s = make(R"({"policy":"deepspeed","init_scale":2,"hysteresis":1})");
  CHECK(scales(run(*s, "I")) == std::vector<double>{1});
  const json before = s->state();
  CHECK_THROWS_AS(run(*s, "I"), gradscale::ScalerError);
  CHECK_THROWS_WITH(run(*s, "I"), Contains("already at minimum"));
  CHECK(s->state() == before);  // the raise happens before any counter moves

  // With hysteresis the raise comes only once the hysteresis is used up.
  auto h = make(R"({"policy":"deepspeed","init_scale":1})");
  CHECK(run(*h, "I")[0].state.at("cur_hysteresis") == 1);
  CHECK_THROWS_AS(run(*h, "I"), gradscale::ScalerError);

  auto quiet = make(R"({"policy":"deepspeed","init_scale":2,"hysteresis":1,"raise_at_min":false})");
  CHECK(scales(run(*quiet, "III")) == std::vector<double>{1, 1, 1});
}

TEST_CASE("megatron: hysteresis counts overflows since the last growth, floor", "[scaler]") {
  auto s =
      make(R"({"policy":"megatron","initial_scale":8,"growth_interval":2,"hysteresis":2,"min_scale":2})");
  const auto r = run(*s, "IIIIFF");
  CHECK(scales(r) == std::vector<double>{8, 4, 2, 2, 2, 4});
  CHECK(counter(r, "hysteresis_tracker") == std::vector<json>{1, 0, -1, -2, -2, 2});
  CHECK(counter(r, "growth_tracker") == std::vector<json>{0, 0, 0, 0, 1, 0});
  // Clean steps between overflows do not refill the hysteresis (unlike deepspeed's consecutive mode).
  auto t = make(R"({"policy":"megatron","initial_scale":8,"growth_interval":10,"hysteresis":2})");
  CHECK(scales(run(*t, "IFI")) == std::vector<double>{8, 8, 4});
  // Defaults: 2^32, growth on clean step 1000.
  auto d = make("megatron");
  CHECK(clean_steps(*d, 999).scale == 4294967296.0);
  CHECK(clean_steps(*d, 1).scale == 8589934592.0);
}

TEST_CASE("megatron: unguarded growth overflows float32 to inf, as in Megatron", "[scaler]") {
  auto s = make(R"({"policy":"megatron","initial_scale":1.7014118346046923e38,"growth_interval":1})");
  const auto r = run(*s, "FI");
  CHECK(std::isinf(r[0].scale));
  CHECK(std::isinf(r[1].scale));  // inf * 0.5 stays inf
  CHECK(r[0].state.at("scale") == "inf");
  // The inf state restores.
  auto t = make(R"({"policy":"megatron","initial_scale":1.7014118346046923e38,"growth_interval":1})");
  t->restore_state(json::parse(s->state().dump()));
  CHECK(std::isinf(t->loss_scale()));
}

TEST_CASE("apex: window growth, ceiling, floor, starts at min(init, max)", "[scaler]") {
  auto s = make(R"({"policy":"apex","init_scale":4,"scale_window":2,"max_scale":8,"min_scale":2})");
  const auto r = run(*s, "FFFFIII");
  CHECK(scales(r) == std::vector<double>{4, 8, 8, 8, 4, 2, 2});
  CHECK(counter(r, "unskipped") == std::vector<json>{1, 0, 1, 0, 0, 0, 0});
  CHECK(skips(r) == std::vector<bool>{false, false, false, false, true, true, true});
  // No floor by default.
  auto n = make(R"({"policy":"apex","init_scale":1})");
  CHECK(scales(run(*n, "II")) == std::vector<double>{0.5, 0.25});
  CHECK(make(R"({"policy":"apex","init_scale":1e9})")->loss_scale() == 16777216.0);
  auto d = make("apex");
  CHECK(clean_steps(*d, 1999).scale == 65536.0);
  CHECK(clean_steps(*d, 1).scale == 131072.0);
}

TEST_CASE("keras: growth_steps, floor 1, growth past float32 keeps the old scale", "[scaler]") {
  auto s = make(R"({"policy":"keras","initial_scale":4,"growth_steps":2})");
  const auto r = run(*s, "FFIIII");
  CHECK(scales(r) == std::vector<double>{4, 8, 4, 2, 1, 1});
  CHECK(counter(r, "good_steps") == std::vector<json>{1, 0, 0, 0, 0, 0});
  auto top = make(R"({"policy":"keras","initial_scale":1.7014118346046923e38,"growth_steps":1})");
  const auto t = run(*top, "F");
  CHECK(t[0].scale == kTwo127);
  CHECK(t[0].state.at("good_steps") == 0);
  auto d = make("keras");
  CHECK(clean_steps(*d, 1999).scale == 32768.0);
  CHECK(clean_steps(*d, 1).scale == 65536.0);
}

TEST_CASE("jmp: period, factor, min_loss_scale, growth past float32", "[scaler]") {
  auto s = make(R"({"policy":"jmp","loss_scale":4,"period":2})");
  const auto r = run(*s, "FFIFI");
  CHECK(scales(r) == std::vector<double>{4, 8, 4, 4, 2});
  CHECK(counter(r, "counter") == std::vector<json>{1, 0, 0, 1, 0});
  CHECK(scales(run(*make(R"({"policy":"jmp","loss_scale":9,"factor":3,"period":1})"), "FI")) ==
        std::vector<double>{27, 9});
  CHECK(scales(run(*make(R"({"policy":"jmp","loss_scale":4,"min_loss_scale":2})"), "II")) ==
        std::vector<double>{2, 2});
  CHECK(scales(run(*make(R"({"policy":"jmp","loss_scale":1.7014118346046923e38,"period":1})"), "F")) ==
        std::vector<double>{kTwo127});
  auto d = make("jmp");
  CHECK(clean_steps(*d, 1999).scale == 32768.0);
  CHECK(clean_steps(*d, 1).scale == 65536.0);
}

TEST_CASE("cerebras: growth after steps_per_increase, tolerance, clamps", "[scaler]") {
  auto s =
      make(R"({"policy":"cerebras","init_scale":4,"steps_per_increase":2,"max_scale":16,"min_scale":1})");
  const auto r = run(*s, "FFFI");
  // Growth when steps_since_rescale exceeds steps_per_increase: the 3rd clean step.
  CHECK(scales(r) == std::vector<double>{4, 4, 8, 4});
  CHECK(counter(r, "steps_since_rescale") == std::vector<json>{1, 2, 0, 0});
  CHECK(counter(r, "num_skipped_steps") == std::vector<json>{0, 0, 0, 1});

  // With a tolerance, an overflow that keeps the ratio at or below it does not lower the scale; the
  // growth check still runs on that (skipped) step.
  auto t = make(
      R"({"policy":"cerebras","init_scale":4,"steps_per_increase":2,"overflow_tolerance":0.5,"max_scale":16})");
  const auto rt = run(*t, "FFII");
  CHECK(scales(rt) == std::vector<double>{4, 4, 8, 4});
  CHECK(skips(rt) == std::vector<bool>{false, false, true, true});
  CHECK(counter(rt, "overflows_since_rescale") == std::vector<json>{0, 0, 0, 0});

  CHECK(scales(run(*make(R"({"policy":"cerebras","init_scale":1,"min_scale":1})"), "I")) ==
        std::vector<double>{1});
  CHECK(scales(run(*make(R"({"policy":"cerebras","init_scale":16,"max_scale":16,"steps_per_increase":1})"),
                   "FF")) == std::vector<double>{16, 16});
  CHECK(make(R"({"policy":"cerebras","init_scale":1e6})")->loss_scale() == 32768.0);
  // Defaults: 2^15 = max; the minimum 2^-14 is reached after 29 overflows and held.
  auto d = make("cerebras");
  for (int i = 0; i < 29; ++i) run(*d, "I");
  CHECK(d->loss_scale() == 0x1p-14);
  CHECK(scales(run(*d, "I")) == std::vector<double>{0x1p-14});
}

TEST_CASE("popart_als: the upper-bin proportion rule, clip and floor", "[scaler]") {
  auto s = make(R"({"policy":"popart_als","initial_scale":1024})");
  CHECK(s->gradient_edge() == 4094.0);  // 65504 / 16
  CHECK(stats_step(*s, 1000, 0).scale == 2048);
  CHECK(stats_step(*s, 1000, 1).scale == 1024);  // 1 / 1001 > 1e-7
  CHECK(stats_step(*s, 0, 0).scale == 2048);     // nothing counted: grows
  const StepReport skipped = stats_step(*s, 999, 1, true);
  CHECK(skipped.skipped);
  CHECK(skipped.scale == 1024);
  CHECK(skipped.state == json{{"loss_scale_update_factor", 1.0}, {"counter", 0}});

  auto top = make(R"({"policy":"popart_als","initial_scale":16384})");
  CHECK(stats_step(*top, 10, 0).scale == 32768);
  CHECK(stats_step(*top, 10, 0).scale == 32768);  // clipped at 2^15 for fp16
  auto bottom = make(R"({"policy":"popart_als","initial_scale":2})");
  CHECK(stats_step(*bottom, 0, 1).scale == 1);
  CHECK(stats_step(*bottom, 0, 1).scale == 1);  // floor of 1
  CHECK(bottom->state().at("loss_scale_update_factor") == 0.5);

  // threshold 0.5: f = 1, so the scale drops only when above > below.
  auto half = make(R"({"policy":"popart_als","initial_scale":4,"threshold":0.5})");
  CHECK(stats_step(*half, 1, 1).scale == 8);
  CHECK(stats_step(*half, 1, 2).scale == 4);
}

TEST_CASE("popart_als: update_period uses the first step of each period", "[scaler]") {
  auto s = make(R"({"policy":"popart_als","initial_scale":4,"update_period":3})");
  CHECK(s->state() == json{{"loss_scale_update_factor", 1.0}, {"counter", -1}});
  std::vector<double> got;
  std::vector<json> counters;
  for (const auto& [below, above] :
       std::vector<std::pair<int, int>>{{10, 0}, {0, 5}, {0, 5}, {10, 0}, {0, 5}}) {
    const StepReport r = stats_step(*s, static_cast<std::uint64_t>(below), static_cast<std::uint64_t>(above));
    got.push_back(r.scale);
    counters.push_back(r.state.at("counter"));
  }
  CHECK(got == std::vector<double>{8, 8, 8, 16, 16});
  CHECK(counters == std::vector<json>{0, 1, 2, 0, 1});
}

TEST_CASE("popart_als: edge and ceiling follow the format", "[scaler]") {
  CHECK(make("popart_als", Format::fp16)->config().at("max_scale") == 32768.0);
  CHECK(make("popart_als", Format::fp8_e5m2)->config().at("max_scale") == 32768.0);
  CHECK(make("popart_als", Format::fp8_e4m3)->config().at("max_scale") == 256.0);
  CHECK(make("popart_als", Format::bf16)->config().at("max_scale") == kTwo127);
  CHECK(make("popart_als", Format::fp32)->config().at("max_scale") == kTwo127);
  CHECK(make("popart_als", Format::fp8_e4m3)->gradient_edge() == 28.0);  // 448 / 16
  CHECK(make(R"({"policy":"popart_als","bin_edge":0.5})", Format::fp16)->gradient_edge() == 32752.0);
  CHECK(make("popart_als", Format::bf16)->gradient_edge() == 0x1.fep123);
}

TEST_CASE("count_about_edge sorts |v| below and at-or-above the edge", "[scaler]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v = {0.0f, -0.0f, 1.0f, -3.999f, 1e-30f, 4.0f, -4.0f, 5.0f, inf, -inf, nan, -nan};
  const gradscale::EdgeCounts c = gradscale::count_about_edge(v.data(), v.size(), 4.0f);
  CHECK(c.below == 5);  // zeros count below, like PopART's histogram
  CHECK(c.above == 5);  // the edge itself and ±inf count above; NaN in neither
  gradscale::EdgeCounts sum;
  sum += c;
  sum += gradscale::count_about_edge(v.data(), 3, 0.5f);
  CHECK(sum.below == 7);
  CHECK(sum.above == 6);
  CHECK(gradscale::count_about_edge(nullptr, 0, 1.0f).below == 0);
  CHECK_THROWS_AS(gradscale::count_about_edge(v.data(), v.size(), 0.0f), gradscale::NumericError);
  CHECK_THROWS_AS(gradscale::count_about_edge(v.data(), v.size(), nan), gradscale::NumericError);
  CHECK_THROWS_AS(gradscale::count_about_edge(v.data(), v.size(), inf), gradscale::NumericError);
}

TEST_CASE("edge_threshold_bits is the smallest |v| whose rounding to F reaches the edge", "[scaler]") {
  using gradscale::Format;
  const auto bits = [](float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
  };
  const auto from = [](std::uint32_t b) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    return x;
  };
  CHECK(gradscale::edge_threshold_bits(4.0f) == bits(4.0f));  // fp32: the edge itself
  // fp16, edge 4096: fp16's step below 4096 is 2, and the midpoint 4095 rounds to the even 4096.
  const std::uint32_t t = gradscale::edge_threshold_bits(4096.0f, Format::fp16);
  CHECK(from(t) == 4095.0f);
  for (const Format f : {Format::fp16, Format::bf16, Format::fp8_e5m2, Format::fp8_e4m3}) {
    for (const float edge : {1e-6f, 0.5f, 3.0f, 28.0f, 4094.0f}) {
      if (edge > gradscale::format_info(f).max_finite) continue;  // no rounding reaches it (e4m3 saturates)
      INFO(gradscale::format_name(f) << " edge " << edge);
      const std::uint32_t c = gradscale::edge_threshold_bits(edge, f);
      CHECK_FALSE(std::fabs(gradscale::quantize(from(c), f)) < edge);
      CHECK(std::fabs(gradscale::quantize(from(c - 1), f)) < edge);
    }
  }
  CHECK_THROWS_AS(gradscale::edge_threshold_bits(0.0f), gradscale::NumericError);
}

TEST_CASE("first_nonfinite: the index of the first inf or NaN, on the host and through the CPU backend",
          "[scaler]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(3000, 1.0f);
  CHECK(gradscale::first_nonfinite(v.data(), v.size()) == -1);
  CHECK(gradscale::first_nonfinite(nullptr, 0) == -1);
  v[2999] = -inf;
  CHECK(gradscale::first_nonfinite(v.data(), v.size()) == 2999);
  v[1500] = nan;
  CHECK(gradscale::first_nonfinite(v.data(), v.size()) == 1500);
  gradscale::Tensor a({2, 2}, 0.5f), b({3}, 2.0f);
  b[2] = inf;
  CHECK(gradscale::cpu_backend().first_nonfinite({&a, &b}) == std::vector<std::int64_t>{-1, 2});
}
