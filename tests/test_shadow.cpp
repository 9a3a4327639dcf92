// The fp32 shadow of the backward pass (lib/train/shadow.h, `gradscale train --shadow`): what precision
// costs each layer. Its figures are 0 where nothing is rounded, equal hand-computed values, leave the
// training itself bit for bit unchanged, and reach the trace, which the schema checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "lib/model/spec.h"
#include "lib/train/shadow.h"
#include "tests/cli_run.h"
#include "tests/temp_dir.h"
#include "tests/weight_bits.h"

using namespace gradscale;
using gradscale::testing::weight_bits;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

struct Run {
  std::vector<std::uint32_t> weights;
  std::vector<StepMonitor> monitors;  // per step
};

// `steps` iterations of a small deep MLP with statistics on every step.
Run train(const Precision& p, const json& scaler, bool shadow, int steps = 3) {
  Rng rng(3);
  std::unique_ptr<Model> net = build_model(builtin_model_spec("deep-mlp:depth=4,width=32,gain=0.5"), rng);
  std::unique_ptr<Optimizer> sgd = make_optimizer({{"name", "sgd"}});
  ScaledTraining t(*net, *sgd, p, scaler, 3);
  t.set_shadow(shadow);
  const DataSplit data = load_data("synthetic:256", 3);
  Batcher batches(data.train, 32, 3);
  Tensor x;
  std::vector<std::int32_t> y;
  Run run;
  for (int i = 0; i < steps; ++i) {
    if (!batches.next(x, y)) batches.next(x, y);
    t.begin_step(true);
    const Tensor& logits = t.forward(x);
    t.loss_backward(logits, y, t.loss_scale(logits, y));
    t.step(0.1);
    run.monitors.push_back(t.monitor());
  }
  run.weights = weight_bits(*net);
  return run;
}

Precision precision(Format f, Format g) {
  Precision p;
  p.format = f;
  p.grad_format = g;
  return p;
}

const json kFixed = {{"policy", "adaptive"}, {"method", "fixed"}, {"fixed_scale", 4}, {"init_scale", 8}};

}  // namespace

TEST_CASE("shadow: with nothing rounded the error is 0 at every layer, under power-of-two scales", "[shadow]") {
  const Run run = train(precision(Format::fp32, Format::fp32), kFixed, true);
  int upstream = 0, weight = 0;
  for (const StepMonitor& m : run.monitors)
    for (const LayerRecord& r : m.records) {
      if (r.has_shadow_upstream) {
        ++upstream;
        CHECK(r.shadow_upstream.rel_error == 0.0);
        CHECK(r.shadow_upstream.underflow_mass == 0.0);
        CHECK(r.shadow_upstream.cosine == Approx(1.0).epsilon(1e-12));
      }
      if (r.has_shadow_weight) {
        ++weight;
        CHECK(r.shadow_weight.rel_error == 0.0);
        CHECK(r.shadow_weight.underflow_mass == 0.0);
      }
    }
  CHECK(upstream > 0);
  CHECK(weight > 0);
}

TEST_CASE("shadow: the training itself is unchanged, bit for bit", "[shadow]") {
  const json measured = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}};
  const Run plain = train(precision(Format::fp16, Format::fp8_e5m2), measured, false, 4);
  const Run shadowed = train(precision(Format::fp16, Format::fp8_e5m2), measured, true, 4);
  CHECK(plain.weights == shadowed.weights);
  bool any_error = false;
  for (const LayerRecord& r : shadowed.monitors.back().records)
    if (r.has_shadow_upstream) any_error = any_error || r.shadow_upstream.rel_error > 0;
  CHECK(any_error);  // e5m2 rounds: the shadow sees it (else the checks above could not fail)
  for (const LayerRecord& r : plain.monitors.back().records) CHECK_FALSE(r.has_shadow_upstream);
}

TEST_CASE("shadow: the underflowed mass, error and cosine of a hand-computed gradient", "[shadow]") {
  // Before rounding {2^-20, 3, -1, 0}; stored {0, 3, -1, 0} at scale 2; the shadow's fp32 {2^-21, 1.5, -0.5, 0}.
  const float before[] = {0x1p-20f, 3.0f, -1.0f, 0.0f};
  const float after[] = {0.0f, 3.0f, -1.0f, 0.0f};
  const float ref[] = {0x1p-21f, 1.5f, -0.5f, 0.0f};
  ShadowSums s;
  s.add_mass(before, after, 4);
  s.add_error(after, 2.0, ref, 4);
  const ShadowMetrics m = s.metrics();
  const double e = std::ldexp(1.0, -21), norm = std::sqrt(e * e + 2.25 + 0.25);
  CHECK(m.underflow_mass == Approx(std::ldexp(1.0, -20) / (std::ldexp(1.0, -20) + 4.0)).epsilon(1e-15));
  CHECK(m.rel_error == Approx(e / norm).epsilon(1e-12));
  CHECK(m.cosine == Approx(2.5 / (norm * std::sqrt(2.5))).epsilon(1e-12));
  ShadowSums zero;
  zero.add_error(after, 1.0, after, 4);
  CHECK(zero.metrics().rel_error == 0.0);
}

TEST_CASE("shadow: gradscale train --shadow traces it, inspect shows it, and it needs a trace", "[shadow][cli]") {
  testing::TempDir dir;
  const std::string base = test::shell_quote((dir.path() / "t").string());
  const test::CliResult run = test::run_cli(
      "train --model mlp --data synthetic:256 --batch 32 --max-steps 4 --threads 1 --quiet --format fp16 "
      "--grad-format fp8_e5m2 --scaler torch --trace " + base + " --trace-every 2 --shadow");
  REQUIRE(run.status == 0);
  const test::CliResult inspect = test::run_cli("inspect " + test::shell_quote((dir.path() / "t.json").string()));
  REQUIRE(inspect.status == 0);
  bool shown = false;
  for (const std::string& line : inspect.lines) shown = shown || line.find("against the fp32 shadow") != std::string::npos;
  CHECK(shown);
  const test::CliResult no_trace =
      test::run_cli("train --model mlp --data synthetic:64 --max-steps 1 --quiet --shadow");
  CHECK(no_trace.status == 2);
  REQUIRE_FALSE(no_trace.lines.empty());
  CHECK_THAT(no_trace.lines.back(), Contains("--trace"));
}
