// Where a per-layer controller acts: "control_at": "gemm" (the default, the paper's
// Linear and Conv2d) or "all" (every layer that sends a gradient upstream). The default is unchanged bit
// for bit; with "all", GlobalAvgPool and BatchNorm take local scales and their fp8 gradients underflow
// less; overflows at such a layer are charged to its own factor; what cannot follow refuses the option.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "adaptive/local_safety.h"
#include "tests/cli_run.h"
#include "tests/weight_bits.h"

using namespace gradscale;
using gradscale::testing::weight_bits;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// conv → BatchNorm → ReLU → global average pooling → linear: the pooling divides the gradient by H·W.
std::unique_ptr<Model> pooled_net(std::uint64_t seed) {
  Rng rng(seed);
  auto net = std::make_unique<Model>("pooled");
  const int c = net->add(std::make_unique<Conv2d>("conv", Conv2d::Options{}.out_channels(8).kernel(3).padding(1).bias(false)),
                         {Model::kModelInput});
  const int b = net->add(std::make_unique<BatchNorm>("bn", BatchNorm::Options{}), {c});
  const int r = net->add(std::make_unique<ReLU>("relu"), {b});
  const int g = net->add(std::make_unique<GlobalAvgPool>("gap"), {r});
  net->add(std::make_unique<Linear>("fc", Linear::Options{}.out_features(10)), {g});
  net->finalize({1, 28, 28}, rng);
  return net;
}

json measured(const char* control_at = nullptr) {
  json c = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"}};
  if (control_at) c["control_at"] = control_at;
  return c;
}

struct Run {
  std::vector<std::uint32_t> weights;
  std::vector<std::vector<LayerScale>> scales;  // per step
  json scaler_config;
};

// `steps` iterations with statistics, fp16 forward and fp8_e5m2 gradients.
Run train(const json& scaler, int steps) {
  std::unique_ptr<Model> net = pooled_net(7);
  std::unique_ptr<Optimizer> adam = make_optimizer({{"name", "adam"}});
  Precision p;
  p.format = Format::fp16;
  p.grad_format = Format::fp8_e5m2;
  ScaledTraining t(*net, *adam, p, scaler, 7);
  const DataSplit data = load_data("synthetic:512", 7);
  Batcher batches(data.train, 32, 7);
  Tensor x;
  std::vector<std::int32_t> y;
  Run run;
  for (int i = 0; i < steps; ++i) {
    if (!batches.next(x, y)) batches.next(x, y);
    t.begin_step(true);
    const Tensor& logits = t.forward(x);
    t.loss_backward(logits, y, t.loss_scale(logits, y));
    t.step(1e-3);
    run.scales.push_back(t.layer_scales());
  }
  run.weights = weight_bits(*net);
  run.scaler_config = t.scaler().config();
  return run;
}

const LayerScale& row(const std::vector<LayerScale>& rows, const std::string& name) {
  for (const LayerScale& l : rows)
    if (l.name == name) return l;
  FAIL("no layer " << name);
  return rows.front();
}

double mean_underflow(const Run& r, const std::string& name) {
  double sum = 0;
  for (const auto& rows : r.scales) sum += row(rows, name).underflow_rate;
  return sum / static_cast<double>(r.scales.size());
}

}  // namespace

TEST_CASE("control_at: the default is the paper's (gemm), bit for bit, and leaves the config as it was",
          "[control_at][adaptive]") {
  const Run none = train(measured(), 8), gemm = train(measured("gemm"), 8);
  CHECK(none.weights == gemm.weights);
  CHECK_FALSE(none.scaler_config.contains("control_at"));
  CHECK_FALSE(gemm.scaler_config.contains("control_at"));
  for (const auto& rows : none.scales)
    for (const LayerScale& l : rows)
      if (!l.parametric) {
        CHECK(l.s == 1);
        CHECK(l.scale_out == l.scale_in);
      }
}

TEST_CASE("control_at all: GlobalAvgPool and BatchNorm take local scales and their fp8 gradients underflow less",
          "[control_at][adaptive]") {
  const Run gemm = train(measured(), 8), all = train(measured("all"), 8);
  CHECK(all.scaler_config.at("control_at") == "all");
  bool gap_scaled = false, bn_scaled = false;
  for (const auto& rows : all.scales) {
    gap_scaled = gap_scaled || row(rows, "gap").s > 1;
    bn_scaled = bn_scaled || row(rows, "bn").s > 1;
    CHECK(row(rows, "gap").scale_out == row(rows, "gap").s * row(rows, "gap").scale_in);
  }
  CHECK(gap_scaled);
  CHECK(bn_scaled);
  const double gap_gemm = mean_underflow(gemm, "gap"), gap_all = mean_underflow(all, "gap");
  const double bn_gemm = mean_underflow(gemm, "bn"), bn_all = mean_underflow(all, "bn");
  INFO("gap underflow " << gap_gemm << " -> " << gap_all << ", bn " << bn_gemm << " -> " << bn_all);
  CHECK(gap_gemm > 1e-3);  // the case the option is for: the pooled gradient underflows by default
  CHECK(gap_all < gap_gemm / 2);
  CHECK(bn_all <= bn_gemm);
  CHECK(all.weights != gemm.weights);
}

TEST_CASE("control_at all: a trace of it passes inspect --check", "[control_at][trace]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradscale_control_at_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(dir);
  const test::CliResult r = test::run_cli(
      "train --model resnet-mini --data synthetic:64 --batch 32 --epochs 2 --max-steps 3 --trace-every 1 --threads 1 --quiet "
      "--format fp16 --grad-format fp8_e5m2 --scaler " +
      test::shell_quote(measured("all").dump()) + " --trace " + test::shell_quote((dir / "t").string()));
  REQUIRE(r.status == 0);
  const test::CliResult c = test::run_cli("inspect --check " + test::shell_quote((dir / "t.json").string()));
  CHECK(c.status == 0);
  REQUIRE_FALSE(c.lines.empty());
  CHECK_THAT(c.lines[0], Contains("ok: 3 steps, 30 layers"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("control_at: bad values and combinations are refused, naming the key", "[control_at][config]") {
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "adaptive"}, {"control_at", "relu"}}, Format::fp16),
                    Contains("'control_at' must be \"gemm\"") && Contains("\"relu\""));
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "adaptive"}, {"control_at", "all"}}, Format::fp16),
                    Contains("needs a method that decides without a weight") && Contains("approx_range"));
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "adaptive"}, {"method", "abs_range"}, {"control_at", "all"}}, Format::fp16),
                    Contains("abs_range"));
  CHECK_NOTHROW(make_scaler(json{{"policy", "adaptive"}, {"method", "fixed"}, {"control_at", "all"}}, Format::fp16));
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "torch"}, {"control_at", "all"}}, Format::fp16), Contains("control_at"));

  // A backward pass computed elsewhere takes local scales at Linear/Conv2d only: refused, not ignored.
  std::vector<LayerInfo> table(2);
  table[0].id = 0;
  table[0].name = "fc";
  table[0].kind = "linear";
  table[0].parametric = true;
  table[0].reduction = 4;
  table[0].weight_shape = {4, 8};
  table[1].id = 1;
  table[1].name = "act";
  table[1].kind = "relu";
  table[1].inputs = {0};
  Precision p;
  p.format = Format::fp16;
  CHECK_THROWS_WITH(ExternalBackward(table, p, measured("all")), Contains("layer 'act'") && Contains("control_at"));
  CHECK_NOTHROW(ExternalBackward(table, p, measured()));
}

TEST_CASE("control_at all: an overflow a non-parametric layer sends upstream is charged to its own factor",
          "[control_at][safety]") {
  // fc0 → relu1 → fc2 (the loss reads fc2).
  std::vector<LayerInfo> t(3);
  const char* kinds[] = {"linear", "relu", "linear"};
  for (int i = 0; i < 3; ++i) {
    t[i].id = i;
    t[i].name = "l" + std::to_string(i);
    t[i].kind = kinds[i];
    t[i].parametric = i != 1;
    t[i].reduction = t[i].parametric ? 8 : 0;
    t[i].inputs = {i - 1};
  }
  StepMonitor m;
  m.reset(3, false, 0.0);
  m.note_overflow(GradSite::upstream, 1, 1e6f, false);

  adaptive::LocalSafety gemm, all;
  gemm.bind(t);
  all.bind(t, true);
  gemm.update(m, 57344.0, 4, 50);
  all.update(m, 57344.0, 4, 50);
  CHECK(gemm.layer_factor(1) == 1);  // the paper's: relu1 passed on the scale fc2 set
  CHECK(gemm.layer_factor(2) < 1);
  CHECK(all.layer_factor(1) < 1);  // "all": relu1 set its own scale
  CHECK(all.layer_factor(2) == 1);
}
