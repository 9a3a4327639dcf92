// The per-layer policy's local safety (SPEC §6.5, adaptive/local_safety.h): weight gradients stored at
// their own factor r and unscaled exactly, overflows charged to the layer (or the loss scale) where they
// happened with a back-off sized to the overflow, recovery, the S0 floor, the skip only on stored
// non-finite values, and a resume in the middle of a back-off that continues bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <vector>

#include <gradscale/gradscale.h>

#include "adaptive/local_safety.h"
#include "lib/layers/layer.h"
#include "lib/layers/linear.h"
#include "lib/layers/precision_ops.h"
#include "lib/numeric/quantize.h"
#include "lib/train/verdict.h"
#include "temp_dir.h"

using namespace gradscale;
using json = nlohmann::json;

namespace {

Precision fp16_forward(Format grads) {
  Precision p;
  p.format = Format::fp16;
  p.grad_format = grads;
  return p;
}

// A chain fc0 → relu1 → fc2 → relu3 → fc4 (the loss reads fc4), as a layer table.
std::vector<LayerInfo> chain_table() {
  std::vector<LayerInfo> t;
  const char* kinds[] = {"linear", "relu", "linear", "relu", "linear"};
  for (int i = 0; i < 5; ++i) {
    LayerInfo l;
    l.id = i;
    l.name = "l" + std::to_string(i);
    l.kind = kinds[i];
    l.parametric = i % 2 == 0;
    l.reduction = l.parametric ? 8 : 0;
    l.inputs = {i - 1};
    t.push_back(l);
  }
  return t;
}

StepMonitor monitor_of(int layers) {
  StepMonitor m;
  m.reset(layers, false, 0.0);
  return m;
}

}  // namespace

TEST_CASE("a weight gradient that would overflow at its layer's scale is stored at its own factor and unscaled exactly",
          "[safety]") {
  const Precision p = fp16_forward(Format::fp8_e4m3);
  Rng rng(1);
  Linear fc("fc", 3, 2, true, InitSpec{}, rng);
  fc.set_id(0);
  Parameter& w = *fc.parameters()[0];
  Parameter& b = *fc.parameters()[1];
  const std::vector<float> gw_values = {1000.0f, -3.0f, 0.5f, 20.0f, 7e-3f, -900.0f}, gb_values = {300.0f, -1.0f};
  const double S = 64;
  auto run = [&](Scaler& scaler, StepMonitor& m) {
    w.grad.fill(0.0f);
    b.grad.fill(0.0f);
    Tensor gw({2, 3}), gb({2});
    for (std::size_t i = 0; i < gw_values.size(); ++i) gw.data()[i] = gw_values[i];
    for (std::size_t i = 0; i < gb_values.size(); ++i) gb.data()[i] = gb_values[i];
    BackwardContext ctx{p, scaler, m, 0};
    accumulate_weight_grads(fc, {{&gw, &w}, {&gb, &b}}, S, ctx);
  };
  SECTION("adaptive: r = 1/4 keeps 1000·r = 250 under 448; each value is quantize(r·g)/(r·S)") {
    auto scaler = make_scaler(json{{"policy", "adaptive"}, {"method", "measured"}}, Format::fp8_e4m3);
    StepMonitor m = monitor_of(1);
    run(*scaler, m);
    CHECK(m.records[0].weight_grad_scale == 0.25);
    CHECK_FALSE(m.found_inf);
    for (std::size_t i = 0; i < gw_values.size(); ++i)
      CHECK(w.grad.data()[i] == quantize(0.25f * gw_values[i], Format::fp8_e4m3) / 16.0f);
    for (std::size_t i = 0; i < gb_values.size(); ++i)
      CHECK(b.grad.data()[i] == quantize(0.25f * gb_values[i], Format::fp8_e4m3) / 16.0f);
  }
  SECTION("small weight gradients are raised to the top of the range (less underflow), exactly") {
    auto scaler = make_scaler(json{{"policy", "adaptive"}, {"method", "measured"}}, Format::fp8_e4m3);
    StepMonitor m = monitor_of(1);
    w.grad.fill(0.0f);
    Tensor gw({2, 3}), gb({2});
    const float tiny[] = {1e-3f, 2e-4f, -5e-4f, 1e-5f, 0.0f, 3e-3f};
    for (int i = 0; i < 6; ++i) gw.data()[i] = tiny[i];
    gb.fill(1e-4f);
    BackwardContext ctx{p, *scaler, m, 0};
    accumulate_weight_grads(fc, {{&gw, &w}, {&gb, &b}}, 1.0, ctx);
    const double r = m.records[0].weight_grad_scale;
    CHECK(r == std::ldexp(1.0, 17));  // 448 / 3e-3 = 149333 → 2^17
    CHECK(w.grad.data()[3] != 0.0f);  // 1e-5 underflows in e4m3 at r = 1 (smallest subnormal 2^-9)
    CHECK(quantize(1e-5f, Format::fp8_e4m3) == 0.0f);
    for (int i = 0; i < 6; ++i)
      CHECK(w.grad.data()[i] == quantize(static_cast<float>(r) * tiny[i], Format::fp8_e4m3) / static_cast<float>(r));
  }
  SECTION("a global policy stores at S: the same gradients overflow") {
    auto scaler = make_scaler("static:64", Format::fp8_e4m3);
    StepMonitor m = monitor_of(1);
    run(*scaler, m);
    CHECK(m.records[0].weight_grad_scale == 1.0);
    CHECK(m.found_inf);
    CHECK(m.records[0].overflow_weight);
    CHECK_FALSE(m.nonfinite_stored);  // e4m3 saturates: clamped, finite
  }
}

TEST_CASE("weight_grad_range_scale is the largest power of two within u_max, and keeps r·S a float", "[safety]") {
  CHECK(weight_grad_range_scale(1000, 448, 1) == 0.25);
  CHECK(weight_grad_range_scale(448, 448, 1) == 1);
  CHECK(weight_grad_range_scale(449, 448, 1) == 0.5);
  CHECK(weight_grad_range_scale(0, 448, 1) == 1);
  CHECK(weight_grad_range_scale(INFINITY, 448, 1) == 1);
  CHECK(weight_grad_range_scale(1e-30, 65504, std::ldexp(1.0, 100)) == std::ldexp(1.0, 26));  // r·S ≤ 2^126
  // bf16's u_max with S_in below 1 (after back-offs): r·S ≤ 2^126 would allow 2^128, which is no float32.
  CHECK(weight_grad_range_scale(0.5, 3.3895313892515355e38, 0.25) == std::ldexp(1.0, 127));
  CHECK(weight_grad_range_scale(1e-30, 3.4028234663852886e38, std::ldexp(1.0, -20)) == std::ldexp(1.0, 127));
}

TEST_CASE("an overflow is charged where it happened, sized, and recovers after recover_every clean steps",
          "[safety]") {
  adaptive::LocalSafety safety;
  safety.bind(chain_table());
  const double u_max = 448;
  const int margin = 4;  // back-offs bring the maximum under 28
  SECTION("at a controlled layer's upstream gradient: that layer alone") {
    StepMonitor m = monitor_of(5);
    m.note_overflow(GradSite::upstream, 2, 1000.0f, false);
    CHECK(safety.update(m, u_max, margin, 3));
    CHECK(safety.layer_factor(2) == 1.0 / 64);  // 28 / 1000 = 0.028 → 2^-6
    CHECK(safety.layer_factor(0) == 1);
    CHECK(safety.layer_factor(4) == 1);
    CHECK(safety.loss_factor() == 1);
    StepMonitor clean = monitor_of(5);
    CHECK_FALSE(safety.update(clean, u_max, margin, 3));
    CHECK_FALSE(safety.update(clean, u_max, margin, 3));
    CHECK(safety.layer_factor(2) == 1.0 / 64);
    safety.update(clean, u_max, margin, 3);  // the third clean step
    CHECK(safety.layer_factor(2) == 1.0 / 32);
  }
  SECTION("at a non-parametric layer: the controlled layer that set the scale it received") {
    StepMonitor m = monitor_of(5);
    m.note_overflow(GradSite::upstream, 3, 60.0f, false);  // relu3 passes on fc4's scale
    safety.update(m, u_max, margin, 3);
    CHECK(safety.layer_factor(4) == 0.25);  // 28 / 60 → 2^-2
    CHECK(safety.layer_factor(2) == 1);
  }
  SECTION("a weight gradient of the last layer: the loss scale's φ, halved") {
    StepMonitor m = monitor_of(5);
    m.note_overflow(GradSite::weight, 4, 1e6f, true);
    safety.update(m, u_max, margin, 3);
    CHECK(safety.loss_factor() == 0.5);
    CHECK(safety.layer_factor(4) == 1);
  }
  SECTION("non-finite values downstream of the first one are its consequence, not new charges") {
    StepMonitor m = monitor_of(5);
    m.note_overflow(GradSite::upstream, 4, 5000.0f, true);  // first, in backward order
    m.note_overflow(GradSite::upstream, 2, INFINITY, true);
    m.note_overflow(GradSite::upstream, 0, INFINITY, true);
    safety.update(m, u_max, margin, 3);
    CHECK(safety.layer_factor(4) == 1.0 / 256);  // 28 / 5000 → 2^-8
    CHECK(safety.layer_factor(2) == 1);
    CHECK(safety.layer_factor(0) == 1);
  }
}

TEST_CASE("a join's overflow is charged to every controlled consumer of the forked tensor", "[safety]") {
  // fc0 → {fc1, fc2} → add3 (the loss reads add3): fc0's output is joined from fc1's and fc2's gradients.
  std::vector<LayerInfo> t(4);
  const char* kinds[] = {"linear", "linear", "linear", "add"};
  for (int i = 0; i < 4; ++i) {
    t[static_cast<std::size_t>(i)].id = i;
    t[static_cast<std::size_t>(i)].kind = kinds[i];
    t[static_cast<std::size_t>(i)].parametric = i < 3;
  }
  t[0].inputs = {-1};
  t[1].inputs = {0};
  t[2].inputs = {0};
  t[3].inputs = {1, 2};
  adaptive::LocalSafety safety;
  safety.bind(t);
  StepMonitor m = monitor_of(4);
  m.note_overflow(GradSite::join, 0, 100.0f, false);
  safety.update(m, 448, 4, 10);
  CHECK(safety.layer_factor(1) == 0.25);
  CHECK(safety.layer_factor(2) == 0.25);
  CHECK(safety.layer_factor(0) == 1);
}

TEST_CASE("charging follows a graph given in any order, cycles included (an outside engine's layer table)",
          "[safety]") {
  // Ids in module order, not in data flow: head (0) reads norm (2, non-parametric), which reads fc (1);
  // fc is called twice, so it also reads itself.
  std::vector<LayerInfo> t(3);
  const char* kinds[] = {"linear", "linear", "layernorm"};
  for (int i = 0; i < 3; ++i) {
    t[static_cast<std::size_t>(i)].id = i;
    t[static_cast<std::size_t>(i)].kind = kinds[i];
    t[static_cast<std::size_t>(i)].parametric = i < 2;
  }
  t[0].inputs = {2};
  t[1].inputs = {-1, 1};
  t[2].inputs = {1};
  adaptive::LocalSafety safety;
  safety.bind(t);
  // fc's weight gradient came at the scale fc's readers set: fc itself (its second call) and, through
  // norm, head.
  StepMonitor m = monitor_of(3);
  m.note_overflow(GradSite::weight, 1, 100.0f, false);
  safety.update(m, 448, 4, 10);
  CHECK(safety.layer_factor(0) == 0.25);
  CHECK(safety.layer_factor(1) == 0.25);
  CHECK(safety.loss_factor() == 1);
  // What norm sends upstream is not its own scale's: head pays. What head receives: the loss scale.
  StepMonitor n = monitor_of(3);
  n.note_overflow(GradSite::upstream, 2, 100.0f, false);
  n.note_overflow(GradSite::join, 0, 100.0f, false);
  safety.update(n, 448, 4, 10);
  CHECK(safety.layer_factor(0) == 0.0625);
  CHECK(safety.layer_factor(1) == 0.25);
  CHECK(safety.loss_factor() == 0.5);
}

TEST_CASE("S0 never goes below the floor where the loss gradient keeps its values", "[safety]") {
  const Precision p = fp16_forward(Format::fp8_e4m3);
  // A loss gradient spanning 2^-14 .. 2^-6 (1024 values): at S0 = 2^-10 everything underflows in e4m3.
  std::vector<float> g(1024);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8, -6 - static_cast<int>(i % 9));
  const Shape shape = {128, 8};
  auto scaler = make_scaler(json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", std::ldexp(1.0, -10)}},
                            Format::fp8_e4m3);
  const double s0 = choose_loss_scale(*scaler, g.data(), shape, 0, p);
  // The floor: the smallest power of two with at most 1e-3 of the values in a binade below 2^-9 after
  // scaling (the smallest is 2^-14: S0 = 2^5), capped by 448·2^-4 / max (max 1.75·2^-6: 2^9 → 2^8.x).
  CHECK(s0 == 32);
  std::size_t zero = 0;
  for (float v : g) zero += quantize(static_cast<float>(s0) * v, Format::fp8_e4m3) == 0.0f;
  CHECK(zero == 0);
  // Overflows at the loss halve φ, but S0 stays at the floor.
  StepMonitor m = monitor_of(1);
  m.note_overflow(GradSite::loss, 0, INFINITY, true);
  for (int i = 0; i < 5; ++i) {
    StepStatistics st;
    st.found_inf = true;
    st.monitor = &m;
    CHECK(scaler->update(st).skipped);
  }
  CHECK(scaler->phi() == 1.0 / 32);
  CHECK(choose_loss_scale(*scaler, g.data(), shape, 1, p) == 32);
}

TEST_CASE("a saturated (clamped, finite) overflow backs off its layer but does not skip the step", "[safety]") {
  auto scaler = make_scaler(json{{"policy", "adaptive"}, {"method", "measured"}}, Format::fp8_e4m3);
  scaler->bind(chain_table(), Format::fp8_e4m3);
  StepMonitor m = monitor_of(5);
  m.note_overflow(GradSite::upstream, 2, 900.0f, false);
  StepStatistics st;
  st.found_inf = m.found_inf;
  st.monitor = &m;
  const StepReport r = scaler->update(st);
  CHECK_FALSE(r.skipped);
  REQUIRE(r.state.at("layers").size() == 1);
  CHECK(r.state.at("layers")[0].at("id") == 2);
  CHECK(r.state.at("layers")[0].at("phi") == 1.0 / 64);  // 28 / 900 → 2^-6
  m.note_overflow(GradSite::upstream, 0, INFINITY, true);  // a stored inf: skipped
  CHECK(scaler->update(st).skipped);
}

TEST_CASE("a resume in the middle of a back-off continues bit for bit", "[safety][resume]") {
  const json spec = json::parse(R"({"name": "safety", "input": [8], "layers": [
    {"type": "linear", "name": "fc1", "out": 16}, {"type": "relu", "name": "r1"},
    {"type": "linear", "name": "fc2", "out": 16}, {"type": "relu", "name": "r2"},
    {"type": "linear", "name": "fc3", "out": 4}]})");
  // A fixed s of 2^12 per layer overflows e4m3 at once: the layers back off, and probe back up every 2 clean steps.
  const json cfg = {{"policy", "adaptive"}, {"method", "fixed"}, {"fixed_scale", 4096}, {"scale_upper_bound", 4096},
                    {"accum_upper_bound", 1e30}, {"recover_every", 2}};
  const Precision p = fp16_forward(Format::fp8_e4m3);
  Tensor x{Shape{16, 8}};
  std::vector<std::int32_t> y;
  {
    Rng data(9);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = n(data);
    for (int i = 0; i < 16; ++i) y.push_back(i % 4);
  }
  struct Run {
    Rng rng{3};
    std::unique_ptr<Model> model;
    std::unique_ptr<Optimizer> opt = make_optimizer(json{{"name", "adam"}});
    std::unique_ptr<ScaledTraining> t;
    Run(const json& spec, const Precision& p, const json& cfg) : model(build_model(spec, rng)) {
      t = std::make_unique<ScaledTraining>(*model, *opt, p, cfg);
    }
    void steps(int n, const Tensor& x, const std::vector<std::int32_t>& y) {
      for (int i = 0; i < n; ++i) {
        t->begin_step(true);
        const Tensor& logits = t->forward(x);
        t->loss_backward(logits, y, t->loss_scale(logits, y));
        t->step(1e-3);
      }
    }
  };
  Run straight(spec, p, cfg);
  straight.steps(4, x, y);
  const json mid = straight.t->scaler().state();
  bool backing_off = false;
  for (const json& l : mid.at("layers")) backing_off = backing_off || (l.contains("phi") && l.at("phi") < 1);
  REQUIRE(backing_off);
  testing::TempDir dir;
  straight.t->save(dir.path().string());
  straight.steps(4, x, y);

  Run resumed(spec, p, cfg);
  resumed.t->load(dir.path().string());
  CHECK(resumed.t->scaler().state() == mid);
  resumed.steps(4, x, y);
  CHECK(resumed.t->scaler().state() == straight.t->scaler().state());
  const auto a = straight.model->parameters(), b = resumed.model->parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::int64_t j = 0; j < a[i]->value.size(); ++j) CHECK(a[i]->value.data()[j] == b[i]->value.data()[j]);
}
