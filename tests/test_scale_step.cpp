// The per-layer steps written once for the three drivers (lib/layers/scale_step.h): SPEC §5's local
// scale — the decision on the statistics a driver attaches, its check, the record and the one rounding —
// and SPEC §6.5's factor r with its power-of-two check and the smallest r a layer's record keeps.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "lib/core/error.h"
#include "lib/layers/scale_step.h"

using namespace gradscale;

namespace {

// A controller that asks for `want`, answers `s` (unbound `unbound`, limit `limit`) and r = `r`, and
// keeps what it was asked.
class FixedController final : public LayerController {
 public:
  StatNeeds want = 0;
  LocalScale answer{4.0, 5.5, kLimitScaleBound};
  double r = 0.25;
  LocalScaleQuery last;
  WeightGradQuery last_weight;
  bool saw_moments = false;
  void bind(const std::vector<LayerInfo>&, Format) override {}
  void begin_step(const StepBegin&) override {}
  StatNeeds needs(int) const override { return want; }
  LocalScale decide(const LocalScaleQuery& q) override {
    last = q;
    saw_moments = q.grad_moments != nullptr && q.grad_moments->count == 3;
    return answer;
  }
  double weight_grad_scale(const WeightGradQuery& q) override {
    last_weight = q;
    return r;
  }
  void end_step(const StepMonitor&) override {}
};

LocalScaleQuery query_at(int layer, double scale_in) {
  return upstream_query(layer, "fc", 7, Format::fp16, scale_in, 12, Shape{2, 3}, Shape{3, 4}, Shape{2, 4});
}

}  // namespace

TEST_CASE("scale step: the decision reads what the driver attached for the controller's needs",
          "[scale_step]") {
  FixedController c;
  c.want = kNeedGradMoments;
  StepMonitor monitor;
  monitor.reset(2, false, 0);
  const std::vector<float> g = {1, -2, 4};
  StatNeeds asked = 0;
  const LocalScale d = decide_local_scale(
      c, query_at(1, 8.0),
      [&](StatNeeds needs, QueryStatistics& stats, LocalScaleQuery& q) {
        asked = needs;
        stats.grad_moments = tensor_moments(g.data(), g.size());
        q.grad_moments = &stats.grad_moments;
      },
      nullptr, "test", monitor, std::chrono::steady_clock::now());
  CHECK(asked == kNeedGradMoments);
  CHECK(c.saw_moments);  // the statistics were alive when the controller decided
  CHECK(c.last.layer_id == 1);
  CHECK(c.last.layer_name == "fc");
  CHECK(c.last.scale_in == 8.0);
  CHECK(c.last.reduction == 12);
  CHECK(c.last.upstream_size == 8);
  CHECK(d.s == 4.0);
  CHECK(d.unbound == 5.5);
  CHECK(d.limit == kLimitScaleBound);
  CHECK(monitor.scaler_seconds >= 0);
}

TEST_CASE("scale step: a local scale that is not finite and > 0 is refused, naming policy and layer",
          "[scale_step]") {
  FixedController c;
  StepMonitor monitor;
  monitor.reset(1, false, 0);
  const auto none = [](StatNeeds, QueryStatistics&, LocalScaleQuery&) {};
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    c.answer = LocalScale{bad, bad, 0};
    REQUIRE_THROWS_AS(decide_local_scale(c, query_at(0, 1.0), none, nullptr, "mine", monitor,
                                         std::chrono::steady_clock::now()),
                      NumericError);
  }
  REQUIRE_THROWS_WITH(check_local_scale(0, "mine", "fc"),
                      Catch::Contains("the controller of policy 'mine' chose local scale 0 at layer 'fc'") &&
                          Catch::Contains("(must be finite and > 0)"));
}

TEST_CASE("scale step: the record takes s, its unbound value and limit, and S_out after one rounding of s·o",
          "[scale_step]") {
  StepMonitor monitor;
  monitor.reset(2, false, 0);
  monitor.record_of(1).scale_out = 3.0;  // note_backward's S_in, before the step
  std::vector<float> multipliers;
  const double out = send_at_local_scale(monitor, 1, LocalScale{0.5, 0.75, kLimitFactor}, 64.0, [&](float m) {
    CHECK(monitor.record_of(1).sent_grad);         // noted before the rounding
    CHECK(monitor.record_of(1).scale_out == 3.0);  // S_out written after it
    multipliers.push_back(m);
  });
  CHECK(multipliers == std::vector<float>{0.5f});
  CHECK(out == 32.0);
  const LayerRecord& r = monitor.record_of(1);
  CHECK(r.local_scale == 0.5);
  CHECK(r.unbound_scale == 0.75);
  CHECK(r.scale_limit == kLimitFactor);
  CHECK(r.scale_out == 32.0);
  CHECK_FALSE(monitor.record_of(0).sent_grad);

  // S_in still on a device (NaN here): S_out is left for the driver to fill when it arrives.
  monitor.record_of(0).scale_out = 2.0;
  const double unknown = send_at_local_scale(
      monitor, 0, LocalScale{}, std::numeric_limits<double>::quiet_NaN(), [](float m) { CHECK(m == 1.0f); });
  CHECK(std::isnan(unknown));
  CHECK(monitor.record_of(0).scale_out == 2.0);
  CHECK(monitor.record_of(0).local_scale == 1.0);
  CHECK(monitor.record_of(0).sent_grad);
}

TEST_CASE("scale step: r is the controller's, checked to be a finite power of two > 0", "[scale_step]") {
  FixedController c;
  c.r = 0.25;
  CHECK(checked_weight_grad_scale(c, 2, "conv", 9, Format::fp8_e5m2, 16.0, 3.5, "adaptive") == 0.25);
  CHECK(c.last_weight.layer_id == 2);
  CHECK(c.last_weight.layer_name == "conv");
  CHECK(c.last_weight.step == 9);
  CHECK(c.last_weight.format == Format::fp8_e5m2);
  CHECK(c.last_weight.scale_in == 16.0);
  CHECK(c.last_weight.max_abs == 3.5);
  for (const double bad : {3.0, 0.0, -2.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    c.r = bad;
    REQUIRE_THROWS_AS(checked_weight_grad_scale(c, 2, "conv", 9, Format::fp16, 1.0, 1.0, "adaptive"),
                      NumericError);
  }
  c.r = 3.0;
  REQUIRE_THROWS_WITH(
      checked_weight_grad_scale(c, 2, "conv", 9, Format::fp16, 1.0, 1.0, "adaptive"),
      Catch::Contains("the controller of policy 'adaptive' chose weight-gradient scale 3 at layer "
                      "'conv' (must be a finite power of two > 0)"));
}

TEST_CASE("scale step: a layer's record keeps the smallest r of its parts", "[scale_step]") {
  LayerRecord r;
  r.weight_grad_scale = 0.125;  // a value from before the layer's first part is not kept
  keep_smallest_weight_grad_scale(r, 4.0, true);
  CHECK(r.weight_grad_scale == 4.0);
  keep_smallest_weight_grad_scale(r, 8.0, false);
  CHECK(r.weight_grad_scale == 4.0);
  keep_smallest_weight_grad_scale(r, 0.5, false);
  CHECK(r.weight_grad_scale == 0.5);
}
