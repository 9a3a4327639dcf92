// A controller of one's own under the built-in loss-level policy ({"policy": "adaptive",
// "controller": NAME}): the user writes only the per-layer decision (docs/api.md's example, below,
// as a user would); S0, φ, skipping and state are the policy's, and φ reaches the controller through
// begin_step. And any loss: ScaledTraining takes a loss gradient the user computed (a regression).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <gradscale/gradscale.h>
#include "tests/precision_fp16.h"

using namespace gradscale;
using gradscale::testing::fp16;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// ---- docs/api.md, "Add your own controller" ------------------------------------------------------
// The largest power of two that keeps the layer's upstream product 2^headroom below the format's top,
// never below 1: a measured-style rule in a few lines, with φ applied to what it chooses.
class Headroom final : public gradscale::LayerController {
 public:
  explicit Headroom(int headroom) : headroom_(headroom) {}
  void bind(const std::vector<gradscale::LayerInfo>&, gradscale::Format f) override {
    top_ = gradscale::format_info(f).max_finite;
  }
  void begin_step(const gradscale::StepBegin& b) override { phi_ = b.phi; }
  gradscale::StatNeeds needs(int) const override { return gradscale::kNeedUpstreamStats; }
  gradscale::LocalScale decide(const gradscale::LocalScaleQuery& q) override {
    const double m = q.upstream_stats->max_abs;  // fp32 product at S_in, before rounding
    double s = 1;
    while (m > 0 && 4 * s * m < std::ldexp(top_, -headroom_)) s *= 2;
    ++decisions_;
    return {std::max(1.0, s * phi_), s};
  }
  void end_step(const gradscale::StepMonitor&) override {}
  nlohmann::json controller_state() const override { return {{"decisions", decisions_}}; }
  void restore_controller_state(const nlohmann::json& s) override { decisions_ = s.at("decisions"); }

  double phi_seen() const { return phi_; }

 private:
  int headroom_;
  double top_ = 0, phi_ = 1;
  std::int64_t decisions_ = 0;
};

Headroom* last_made = nullptr;

void register_headroom_once() {
  static const bool done = [] {
    gradscale::register_controller("headroom", [](const nlohmann::json& config, gradscale::Format) {
      auto c = std::make_unique<Headroom>(config.value("headroom", 8));
      last_made = c.get();
      return c;
    });
    return true;
  }();
  (void)done;
}
// --------------------------------------------------------------------------------------------------

json mlp_spec() {
  return json::parse(R"({"name": "ctl", "input": [8], "layers": [
    {"type": "linear", "name": "fc1", "out": 16}, {"type": "relu", "name": "r"},
    {"type": "linear", "name": "fc2", "out": 16}, {"type": "relu", "name": "r2"},
    {"type": "linear", "name": "fc3", "out": 4}]})");
}

struct Setup {
  Rng rng{3};
  std::unique_ptr<Model> model = build_model(mlp_spec(), rng);
  std::unique_ptr<Optimizer> opt = make_optimizer(json{{"name", "sgd"}});
  Tensor x{Shape{16, 8}};
  std::vector<std::int32_t> y;
  Setup() {
    std::normal_distribution<float> n(0.0f, 0.01f);
    for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = n(rng);
    for (int i = 0; i < 16; ++i) y.push_back(i % 4);
  }
};

StepResult one_step(ScaledTraining& t, Setup& s, double lr = 0.1) {
  t.begin_step(true);
  const Tensor& logits = t.forward(s.x);
  const double s0 = t.loss_scale(logits, s.y);
  t.loss_backward(logits, s.y, s0);
  return t.step(lr);
}

}  // namespace

TEST_CASE("a registered controller decides the local scales under adaptive's loss-level policy", "[controller]") {
  register_headroom_once();
  Setup s;
  ScaledTraining t(*s.model, *s.opt, fp16(),
                   json{{"policy", "adaptive"}, {"controller", "headroom"}, {"controller_config", {{"headroom", 6}}}});
  REQUIRE(last_made != nullptr);
  Headroom* mine = last_made;
  CHECK(t.scaler().layer_controller() == mine);
  const StepResult r = one_step(t, s);
  CHECK_FALSE(r.skipped);
  bool raised = false;
  for (const LayerScale& row : t.layer_scales())
    if (row.parametric && row.sent) {
      // Its rule, checked from what the step recorded: the largest power of two under 2^-6·65504.
      const double m = t.monitor().records[static_cast<std::size_t>(row.id)].sent_max_abs / row.s;
      if (row.s > 1) {
        CHECK(2 * row.s * m < std::ldexp(65504.0, -6));
        CHECK(4 * row.s * m >= std::ldexp(65504.0, -6));
        raised = true;
      }
    }
  CHECK(raised);
  CHECK(t.scaler().config().at("controller") == "headroom");
  CHECK(t.scaler().state().at("controller").at("decisions") == 2);
}

TEST_CASE("phi reaches a registered controller through begin_step, and its state round-trips", "[controller]") {
  register_headroom_once();
  Setup s;
  // S0 = 2^40 overflows fp16 at the loss: the policy skips and halves φ, which the controller sees.
  const json cfg = {{"policy", "adaptive"}, {"controller", "headroom"}, {"init_scale", std::ldexp(1.0, 40)}};
  ScaledTraining t(*s.model, *s.opt, fp16(), cfg);
  Headroom* mine = last_made;
  const StepResult r = one_step(t, s);
  CHECK(r.skipped);
  CHECK(r.phi == 0.5);
  t.begin_step();
  CHECK(mine->phi_seen() == 0.5);
  const json saved = t.scaler().state();
  CHECK(saved.at("phi") == 0.5);
  auto other = make_scaler(cfg, Format::fp16);
  other->restore_state(saved);
  CHECK(other->state() == saved);
  CHECK(other->phi() == 0.5);
}

TEST_CASE("a controller configuration that mixes in a method, or names no controller, is refused", "[controller]") {
  register_headroom_once();
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "adaptive"}, {"controller", "headroom"}, {"method", "measured"}},
                                Format::fp16),
                    Contains("'method' belongs to the built-in methods"));
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "adaptive"}, {"controller", "nobody"}}, Format::fp16),
                    Contains("unknown controller 'nobody'") && Contains("headroom"));
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "adaptive"}, {"controller_config", json::object()}}, Format::fp16),
                    Contains("without 'controller'"));
  auto plain = make_scaler(json{{"policy", "adaptive"}}, Format::fp16);
  json state = plain->state();
  state["controller"] = nullptr;
  CHECK_THROWS_WITH(plain->restore_state(state), Contains("runs method"));
}

TEST_CASE("any loss: a regression trained with a loss gradient the user computes", "[controller][api]") {
  Setup s;
  ScaledTraining t(*s.model, *s.opt, fp16(), json("static:1024"));
  // Mean squared error against a target of 0.5 for every output: dL/dy = 2(y - 0.5)/n.
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    t.begin_step(step == 0);
    const Tensor& y = t.forward(s.x);
    Tensor grad(y.shape());
    double loss = 0;
    float largest = 0;
    const auto n = static_cast<double>(y.size());
    for (std::int64_t i = 0; i < y.size(); ++i) {
      const double d = y.data()[i] - 0.5;
      loss += d * d / n;
      grad.data()[i] = static_cast<float>(2 * d / n);
      largest = std::max(largest, std::fabs(grad.data()[i]));
    }
    const double s0 = t.loss_scale(grad);
    CHECK(s0 == 1024);
    t.backward(grad, s0, loss);
    if (step == 0) {
      // The loss gradient was multiplied by S0 before its one rounding.
      CHECK(t.monitor().has_loss_grad);
      CHECK(t.monitor().loss_grad_max_abs == largest * 1024);
    }
    const StepResult r = t.step(0.5);
    CHECK(r.loss == loss);
    (step == 0 ? first : last) = loss;
  }
  CHECK(last < first * 0.1);
  // The wrong shape, or the wrong phase, is refused.
  t.begin_step();
  t.forward(s.x);
  CHECK_THROWS_WITH(t.backward(Tensor(Shape{3}), 1), Contains("the loss gradient has shape"));
}
