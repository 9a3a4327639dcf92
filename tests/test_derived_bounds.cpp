// The adaptive policy's derived bounds (SPEC §6.6, "bounds": "derived"; adaptive/derived_bounds.h): the
// accumulated scale a controlled layer sends upstream is held to u_max·2^-margin over the largest
// unscaled magnitude its pass-through layers sent the step before, and nothing else bounds it; the
// keys refused with it; its state resumed; a deep stack in e5m2 gets scales above the reference's
// constant 1024 without an overflow; and "bounds": "reference" is the default, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "adaptive/derived_bounds.h"
#include "adaptive/local_safety.h"
#include "lib/core/error.h"

using namespace gradscale;
using json = nlohmann::json;

namespace {

// fc0 → bn1 → fc2 (the loss reads fc2): bn1 passes on the scale fc2 sets.
std::vector<LayerInfo> linear_bn_linear() {
  std::vector<LayerInfo> t;
  const char* kinds[] = {"linear", "batchnorm", "linear"};
  for (int i = 0; i < 3; ++i) {
    LayerInfo l;
    l.id = i;
    l.name = "l" + std::to_string(i);
    l.kind = kinds[i];
    l.parametric = i != 1;
    l.reduction = l.parametric ? 8 : 0;
    l.weight_shape = l.parametric ? Shape{8, 8} : Shape{};
    l.inputs = {i - 1};
    t.push_back(l);
  }
  return t;
}

// The step's record of a pass-through layer that sent max|g| = `sent_max` (fp32) at scale `scale_out`.
StepMonitor sent_by(int layer, float sent_max, double scale_out, int layers = 3) {
  StepMonitor m;
  m.reset(layers, false, 0.0);
  LayerRecord& r = m.record_of(layer);
  r.ran = true;
  r.sent_grad = true;
  r.sent_max_abs = sent_max;
  r.scale_in = r.scale_out = scale_out;
  return m;
}

double decide(Scaler& scaler, int layer, double scale_in) {
  LocalScaleQuery q;
  q.layer_id = layer;
  q.format = Format::fp8_e5m2;
  q.scale_in = scale_in;
  q.reduction = 8;
  return scaler.layer_controller()->decide(q).s;
}

const json kFixedDerived = {{"policy", "adaptive"}, {"method", "fixed"}, {"fixed_scale", 1048576}, {"bounds", "derived"}};

}  // namespace

TEST_CASE("derived bounds hold a layer's accumulated scale to u_max·2^-margin over what its pass-through layers sent",
          "[derived_bounds]") {
  auto scaler = make_scaler(kFixedDerived, Format::fp8_e5m2);
  scaler->bind(linear_bn_linear(), Format::fp8_e5m2);
  // Nothing measured yet: no bound at all (the reference would give min(16, 1024 / 4) = 16).
  CHECK(decide(*scaler, 2, 4) == 1048576);
  // bn1 sent max|g| = 3000 at scale 1024: D = 3000 / 1024 for fc2, the layer that set that scale.
  StepMonitor m = sent_by(1, 3000.0f, 1024);
  StepStatistics st;
  st.monitor = &m;
  CHECK_FALSE(scaler->update(st).skipped);
  const double d = 3000.0 / 1024;
  const double bound = std::ldexp(57344.0, -4) / d;  // B = u_max·2^-margin / D, e5m2's u_max, margin 4
  const double s = decide(*scaler, 2, 4);
  CHECK(s == 256);  // the largest power of two ≤ B / S_in = 305.8
  CHECK(s * 4 <= bound);
  CHECK(s * 2 * 4 > bound);
  // The value bn1 would send at that scale keeps the margin's headroom below e5m2's largest finite.
  CHECK(s * 4 * d <= std::ldexp(57344.0, -4));
  // fc0 sets no pass-through layer's scale: still unbounded.
  CHECK(decide(*scaler, 0, 4) == 1048576);
  // The next measurement replaces D: a smaller magnitude lifts the bound.
  StepMonitor smaller = sent_by(1, 3.0f, 1024);
  st.monitor = &smaller;
  scaler->update(st);
  CHECK(decide(*scaler, 2, 4) == 262144);  // B / 4 = 3584·1024 / 3 / 4 = 305834.7 → 2^18
  // A non-finite maximum is an overflow (local safety's), not a magnitude: D stays as it was.
  StepMonitor inf = sent_by(1, INFINITY, 1024);
  st.monitor = &inf;
  scaler->update(st);
  CHECK(decide(*scaler, 2, 4) == 262144);
  // The device rule carries the same bound, so a device backend decides the same s.
  const std::optional<ScaleRule> rule = scaler->layer_controller()->device_rule(2);
  REQUIRE(rule);
  CHECK(rule->bounds.accum_upper_bound == std::ldexp(57344.0, -4) / (3.0 / 1024));
  CHECK(rule->bounds.scale_upper_bound == std::numeric_limits<double>::infinity());
}

TEST_CASE("with control_at all every layer has its own scale and no accumulated bound remains", "[derived_bounds]") {
  json cfg = kFixedDerived;
  cfg["control_at"] = "all";
  auto scaler = make_scaler(cfg, Format::fp8_e5m2);
  scaler->bind(linear_bn_linear(), Format::fp8_e5m2);
  StepMonitor m = sent_by(1, 3000.0f, 1024);
  StepStatistics st;
  st.monitor = &m;
  scaler->update(st);
  CHECK(decide(*scaler, 2, 4) == 1048576);  // bn1 is controlled: its own scale guards its rounding
}

TEST_CASE("derived bounds: the constants are refused with them, the config and state round-trip",
          "[derived_bounds]") {
  for (const char* key : {"scale_upper_bound", "accum_upper_bound"}) {
    json bad = kFixedDerived;
    bad[key] = 64;
    CHECK_THROWS_WITH(make_scaler(bad, Format::fp8_e5m2),
                      Catch::Contains(std::string("'") + key + "' is a constant of \"bounds\": \"reference\""));
    json layer_bad = kFixedDerived;
    layer_bad["layers"] = {{"l2", {{key, 64}}}};
    CHECK_THROWS_WITH(make_scaler(layer_bad, Format::fp8_e5m2), Catch::Contains(key));
  }
  json wrong = kFixedDerived;
  wrong["bounds"] = "constant";
  CHECK_THROWS_WITH(make_scaler(wrong, Format::fp8_e5m2), Catch::Contains("'bounds' must be \"reference\""));

  auto scaler = make_scaler(kFixedDerived, Format::fp8_e5m2);
  CHECK(scaler->config().at("bounds") == "derived");
  CHECK_FALSE(scaler->config().contains("accum_upper_bound"));
  CHECK(make_scaler(scaler->config(), Format::fp8_e5m2)->config() == scaler->config());
  // The reference keeps its keys, and says nothing of "bounds": its configs and traces are unchanged.
  const json reference = make_scaler(json{{"policy", "adaptive"}, {"method", "measured"}}, Format::fp16)->config();
  CHECK_FALSE(reference.contains("bounds"));
  CHECK(reference.at("accum_upper_bound") == 1024);
  CHECK(make_scaler(json{{"policy", "adaptive"}, {"method", "measured"}, {"bounds", "reference"}}, Format::fp16)
            ->config() == reference);

  scaler->bind(linear_bn_linear(), Format::fp8_e5m2);
  StepMonitor m = sent_by(1, 3000.0f, 1024);
  StepStatistics st;
  st.monitor = &m;
  scaler->update(st);
  const json state = scaler->state();
  REQUIRE(state.at("layers").size() == 1);
  CHECK(state.at("layers")[0].at("id") == 2);
  CHECK(state.at("layers")[0].at("downstream_max") == 3000.0 / 1024);
  auto resumed = make_scaler(kFixedDerived, Format::fp8_e5m2);
  resumed->bind(linear_bn_linear(), Format::fp8_e5m2);
  resumed->restore_state(state);
  CHECK(resumed->state() == state);
  CHECK(decide(*resumed, 2, 4) == decide(*scaler, 2, 4));
  // A reference policy refuses a derived state's D.
  auto ref = make_scaler(json{{"policy", "adaptive"}, {"method", "fixed"}}, Format::fp8_e5m2);
  ref->bind(linear_bn_linear(), Format::fp8_e5m2);
  CHECK_THROWS_WITH(ref->restore_state(state), Catch::Contains("'downstream_max' belongs to \"bounds\": \"derived\""));
}

TEST_CASE("a deep stack in e5m2 gets accumulated scales above 1024 under derived bounds, without an overflow",
          "[derived_bounds]") {
  // deep-mlp 16×256 with fp8_e5m2 gradients: measured asks for more than the reference's constant allows.
  const json spec = {{"name", "deep"}, {"input", {64}}};
  json layers = json::array();
  for (int i = 0; i < 12; ++i) {
    layers.push_back({{"type", "linear"}, {"name", "fc" + std::to_string(i)}, {"out", 64}, {"gain", 0.7}});
    layers.push_back({{"type", "relu"}, {"name", "r" + std::to_string(i)}});
  }
  layers.push_back({{"type", "linear"}, {"name", "head"}, {"out", 10}});
  json model = spec;
  model["layers"] = layers;
  Precision p;
  p.format = Format::fp16;
  p.grad_format = Format::fp8_e5m2;
  Tensor x{Shape{32, 64}};
  std::vector<std::int32_t> y;
  {
    Rng data(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = n(data);
    for (int i = 0; i < 32; ++i) y.push_back(i % 10);
  }
  struct Seen {
    double largest = 0;  // the largest S_out a layer sent
    double asked = 0;    // the largest unbound s·S_in: what measured asked for
    bool overflow = false;
  };
  const auto run = [&](const json& cfg) {
    Rng rng(7);
    std::unique_ptr<Model> m = build_model(model, rng);
    std::unique_ptr<Optimizer> opt = make_optimizer(json{{"name", "sgd"}});
    ScaledTraining t(*m, *opt, p, cfg);
    Seen seen;
    for (int i = 0; i < 6; ++i) {
      t.begin_step(true);
      const Tensor& logits = t.forward(x);
      t.loss_backward(logits, y, t.loss_scale(logits, y));
      for (const LayerRecord& r : t.monitor().records) {
        if (!r.sent_grad) continue;
        seen.largest = std::max(seen.largest, r.scale_out);
        seen.asked = std::max(seen.asked, r.unbound_scale * r.scale_in);
      }
      seen.overflow = seen.overflow || t.monitor().found_inf;
      t.step(1e-3);
    }
    return seen;
  };
  const json base = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"}};
  const Seen reference = run(base);
  CHECK(reference.largest <= 1024);  // the reference's constant holds every layer at S_out ≤ 1024 ...
  CHECK(reference.asked > 1024);     // ... where measured asks for more
  CHECK_FALSE(reference.overflow);
  json derived = base;
  derived["bounds"] = "derived";
  const Seen lifted = run(derived);
  CHECK(lifted.largest > 1024);
  CHECK_FALSE(lifted.overflow);
}

TEST_CASE("a decision says what held its s: the method, its margin cap, a bound, or φ_l", "[derived_bounds][trace]") {
  const ScaleBounds reference{16, 1024, true};
  CHECK(scale_limit(8, 4, reference, 1, false) == kLimitMethod);
  CHECK(scale_limit(8, 4, reference, 1, true) == kLimitMargin);
  CHECK(scale_limit(64, 4, reference, 1, false) == kLimitScaleBound);      // 16 < 64, 1024 / 4 = 256
  CHECK(scale_limit(64, 512, reference, 1, false) == kLimitAccumBound);    // 1024 / 512 = 2
  CHECK(scale_limit(64, 512, reference, 0.5, false) == kLimitFactor);      // φ_l below 1 comes first
  CHECK(std::string(scale_limit_name(kLimitAccumBound)) == "accum_bound");
  // The policy's decision carries it: fc2 held by its derived bound once bn1's magnitude is known.
  auto scaler = make_scaler(kFixedDerived, Format::fp8_e5m2);
  scaler->bind(linear_bn_linear(), Format::fp8_e5m2);
  LocalScaleQuery q;
  q.layer_id = 2;
  q.format = Format::fp8_e5m2;
  q.scale_in = 4;
  q.reduction = 8;
  CHECK(scaler->layer_controller()->decide(q).limit == kLimitMethod);
  StepMonitor m = sent_by(1, 3000.0f, 1024);
  StepStatistics st;
  st.monitor = &m;
  scaler->update(st);
  CHECK(scaler->layer_controller()->decide(q).limit == kLimitAccumBound);
  // measured's headroom cap: the unbound s is u_max·2^-margin / max|o| exactly.
  ScaleRuleParams p;
  p.u_max = 57344;
  p.margin = 4;
  CHECK(measured_margin_capped(3584.0 / 3, 3, p));
  CHECK_FALSE(measured_margin_capped(1024, 3, p));
}
