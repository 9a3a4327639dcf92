// The model graph: the backward join rule (SPEC §5), JSON model specs and their errors, built-in
// architectures, and gradients through a residual graph against finite differences.
#include <catch2/catch.hpp>

#include <cmath>

#include "lib/layers/softmax_cross_entropy.h"
#include "lib/model/join.h"
#include "lib/model/spec.h"
#include "lib/scaler/scaler.h"

using namespace gradscale;
using json = nlohmann::json;

namespace {

ScaledGrad filled(const Shape& shape, std::initializer_list<float> values, double scale) {
  ScaledGrad g;
  g.g.reset(shape, 0.0f);
  std::int64_t i = 0;
  for (float v : values) g.g[i++] = v;
  g.scale = scale;
  return g;
}

std::string error_of(const json& spec) {
  Rng rng(1);
  try {
    build_model(spec, rng);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("join rule: equal scales pass through, 65536 and 2 meet at 2", "[model][join]") {
  CHECK(join_target_scale({1.0, 2.0}, {8.0, 8.0}, Format::fp16) == 8.0);
  // True magnitudes up to 1: at 65536 the sum could reach 2·65536 > 65504, so the parts meet at 2.
  CHECK(join_target_scale({65536.0, 2.0}, {65536.0, 2.0}, Format::fp16) == 2.0);
  // Small true values: the larger scale qualifies and wins.
  CHECK(join_target_scale({1.0, 2.0 / 65536.0}, {65536.0, 2.0}, Format::fp16) == 65536.0);
  // Nothing qualifies: halve the smallest scale until it does (2·m·T < 65504 with m = 1e5).
  const double t = join_target_scale({1e5 * 4, 1e5 * 8}, {4.0, 8.0}, Format::fp16);
  CHECK(2 * 1e5 * t < 65504);
  CHECK(2 * 1e5 * (2 * t) >= 65504);

  StepMonitor monitor;
  monitor.reset(1, false, 0);
  Precision p{Format::fp16};
  const ScaledGrad a = filled({1, 2}, {65536.0f * 0.5f, 0.0f}, 65536.0);  // true 0.5
  const ScaledGrad b = filled({1, 2}, {1.0f, 2.0f}, 2.0);                 // true 0.5, 1.0
  ScaledGrad out;
  join_scaled_grads({&a, &b}, out, p, monitor, 0);
  CHECK(out.scale == 2.0);
  CHECK(out.g[0] == 2.0f);  // (0.5 + 0.5) · 2
  CHECK(out.g[1] == 2.0f);  // 1.0 · 2
  CHECK_FALSE(monitor.found_inf);
}

TEST_CASE("model spec: errors name the layer and the key", "[model][spec]") {
  const json base_input = {1, 28, 28};
  CHECK_THAT(error_of({{"input", base_input}, {"layers", {{{"type", "flatten"}}, {{"type", "linear"}}}}}),
             Catch::Contains("layer 1") && Catch::Contains("missing required key 'out'"));
  CHECK_THAT(error_of({{"input", base_input},
                       {"layers", {{{"type", "flatten"}}, {{"type", "linaer"}, {"out", 10}}}}}),
             Catch::Contains("layer 1") && Catch::Contains("unknown type") && Catch::Contains("linear"));
  CHECK_THAT(
      error_of({{"input", base_input},
                {"layers",
                 {{{"type", "flatten"}}, {{"name", "fc"}, {"type", "linear"}, {"out", 10}, {"size", 3}}}}}),
      Catch::Contains("'fc'") && Catch::Contains("unknown key 'size'"));
  CHECK_THAT(
      error_of({{"input", base_input},
                {"layers", {{{"type", "flatten"}}, {{"name", "fc"}, {"type", "linear"}, {"out", -3}}}}}),
      Catch::Contains("'fc'") && Catch::Contains("'out' must be >= 1"));
  CHECK_THAT(
      error_of({{"input", base_input},
                {"layers",
                 {{{"type", "flatten"}}, {{"name", "fc"}, {"type", "linear"}, {"in", 100}, {"out", 10}}}}}),
      Catch::Contains("'fc'") && Catch::Contains("784 features"));
  CHECK_THAT(error_of({{"input", base_input},
                       {"layers",
                        {{{"type", "flatten"}, {"name", "f"}},
                         {{"type", "add"}, {"name", "j"}, {"inputs", {"f", "nope"}}}}}}),
             Catch::Contains("'j'") && Catch::Contains("input 'nope' is not an earlier layer"));
  CHECK_THAT(error_of({{"input", base_input}, {"layers", {{{"type", "conv2d"}, {"name", "c"}, {"out", 4}}}}}),
             Catch::Contains("'c'") && Catch::Contains("'kernel'"));
  CHECK_THAT(error_of({{"layers", json::array()}}), Catch::Contains("input"));
  CHECK_THAT(error_of({{"input", base_input}, {"layers", {{{"type", "flatten"}}}}, {"extra", 1}}),
             Catch::Contains("unknown key 'extra'"));
  CHECK_THROWS_WITH(builtin_model_spec("resnet-mini:m=3"), Catch::Contains("unknown parameter 'm'"));
  CHECK_THROWS_WITH(builtin_model_spec("vgg"), Catch::Contains("unknown model 'vgg'"));
}

TEST_CASE("built-in models have the documented architectures", "[model][spec]") {
  Rng rng(3);
  auto mlp = build_model(builtin_model_spec("mlp"), rng);
  CHECK(mlp->num_parameters() == 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
  auto cnn = build_model(builtin_model_spec("cnn"), rng);
  CHECK(cnn->num_parameters() == (32 * 9 + 32) + (64 * 32 * 9 + 64) + (3136 * 128 + 128) + (128 * 10 + 10));
  auto deep = build_model(builtin_model_spec("deep-mlp:depth=5,width=64,gain=0.5"), rng);
  CHECK(deep->num_layers() == 1 + 2 * 5 + 1);
  auto res = build_model(builtin_model_spec("resnet-mini:n=2"), rng);
  const json table = res->layer_table();
  int adds = 0, projections = 0;
  for (const json& row : table) {
    adds += row["kind"] == "add";
    projections +=
        row["name"].get<std::string>().find("proj") != std::string::npos && row["kind"] == "conv2d";
  }
  CHECK(adds == 6);         // 3 stages × 2 blocks
  CHECK(projections == 2);  // stages 2 and 3 change shape
  CHECK(table.back()["kind"] == "linear");
}

namespace {

// A controller that always answers 1 (global scaling) and never skips.
class UnitScaler final : public Scaler {
 public:
  std::string policy() const override { return "unit"; }
  double loss_scale() const override { return 1.0; }
  StepReport update(const StepStatistics&) override { return {}; }
  json config() const override { return {{"policy", "unit"}}; }
  json state() const override { return json::object(); }
  void restore_state(const json&) override {}
};

// One fp32 gradient step without the update: working weights, forward, loss, zeroed gradients, backward.
void compute_gradients(Model& model, const Tensor& x, const std::vector<std::int32_t>& y, Scaler& scaler) {
  const Precision p;
  model.prepare_weights(p);
  StepMonitor monitor;
  monitor.reset(model.num_layers(), false, 0);
  ForwardContext f{p, true, nullptr};
  ScaledGrad g;
  softmax_cross_entropy(model.forward(x, f), y.data(), 1.0, p, &g, &monitor, model.num_layers() - 1);
  model.zero_grads();
  BackwardContext b{p, scaler, monitor};
  model.backward(g, b);
}

double loss_of(Model& m, const Tensor& x, const std::vector<std::int32_t>& y, const Precision& p) {
  ForwardContext f{p, true, nullptr};
  return softmax_cross_entropy(m.forward(x, f), y.data(), 1.0, p, nullptr, nullptr, -1).loss;
}

}  // namespace

TEST_CASE("a residual graph's parameter gradients match central differences", "[model]") {
  // Fork at 'a' (two consumers: the branch and the join), so the backward join runs.
  const json spec = {{"input", {6}},
                     {"layers",
                      {{{"type", "linear"}, {"name", "a"}, {"out", 5}},
                       {{"type", "relu"}, {"name", "r"}},
                       {{"type", "linear"}, {"name", "b"}, {"out", 5}},
                       {{"type", "add"}, {"name", "j"}, {"inputs", {"b", "a"}}},
                       {{"type", "linear"}, {"name", "out"}, {"out", 3}}}}};
  Rng rng(5);
  auto model = build_model(spec, rng);
  Precision p;  // fp32
  Tensor x({4, 6});
  for (std::int64_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  const std::vector<std::int32_t> y = {0, 2, 1, 2};
  UnitScaler unit;
  compute_gradients(*model, x, y, unit);
  for (Parameter* param : model->parameters()) {
    for (std::int64_t i = 0; i < param->value.size(); i += 3) {
      const float keep = param->value[i];
      const float h = 1e-2f;
      param->value[i] = keep + h;
      model->prepare_weights(p);
      const double up = loss_of(*model, x, y, p);
      param->value[i] = keep - h;
      model->prepare_weights(p);
      const double down = loss_of(*model, x, y, p);
      param->value[i] = keep;
      INFO(param->name << "[" << i << "]");
      // Central difference error O(h^2 · |f'''|) plus fp32 loss noise / h: 2e-3 absolute is ample here.
      CHECK(param->grad[i] == Approx((up - down) / (2 * h)).margin(2e-3));
    }
  }
  model->prepare_weights(p);
}

namespace {

// Counts the local-scale queries per layer id: a query means the layer computed an input gradient.
class QueryCounter final : public Scaler, public LayerController {
 public:
  std::vector<int> asked;
  std::string policy() const override { return "count"; }
  double loss_scale() const override { return 1.0; }
  LayerController* layer_controller() override { return this; }
  void bind(const std::vector<LayerInfo>&, Format) override {}
  void begin_step(const StepBegin&) override {}
  StatNeeds needs(int) const override { return 0; }
  void end_step(const StepMonitor&) override {}
  LocalScale decide(const LocalScaleQuery& q) override {
    asked.push_back(q.layer_id);
    return {1.0, 1.0};
  }
  StepReport update(const StepStatistics&) override { return {}; }
  json config() const override { return {{"policy", "count"}}; }
  json state() const override { return json::object(); }
  void restore_state(const json&) override {}
};

}  // namespace

TEST_CASE("backward skips input gradients with no parameter upstream, profiling times each layer",
          "[model]") {
  // flatten (no parameters, fed by the model input) -> a -> relu -> b: layer a must not compute the
  // gradient of its input (nothing upstream to train), b must; flatten's backward must not run.
  const json spec = {{"input", {2, 3, 3}},
                     {"layers",
                      {{{"type", "flatten"}, {"name", "f"}},
                       {{"type", "linear"}, {"name", "a"}, {"out", 5}},
                       {{"type", "relu"}, {"name", "r"}},
                       {{"type", "linear"}, {"name", "b"}, {"out", 3}}}}};
  Rng rng(9);
  auto model = build_model(spec, rng);
  Tensor x({4, 2, 3, 3});
  for (std::int64_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::cos(0.3 * static_cast<double>(i)));
  const std::vector<std::int32_t> y = {0, 1, 2, 1};
  for (bool profile : {false, true}) {
    INFO("profiling " << profile);
    model->set_profiling(profile);
    QueryCounter counter;
    compute_gradients(*model, x, y, counter);
    CHECK(counter.asked == std::vector<int>{3});  // only b asks for a local scale
    for (Parameter* param : model->parameters()) {
      bool any = false;
      for (std::int64_t i = 0; i < param->grad.size(); ++i) any = any || param->grad[i] != 0.0f;
      CHECK(any);  // every parameter still gets its gradient
    }
    const auto& times = model->layer_times();
    REQUIRE(times.size() == 4);
    double forward = 0, backward = 0;
    for (const auto& t : times) {
      forward += t.forward;
      backward += t.backward;
    }
    CHECK(times[0].backward == 0.0);  // flatten's backward never ran
    if (profile) {
      CHECK(forward > 0.0);
      CHECK(backward > 0.0);
    } else {
      CHECK(forward == 0.0);
      CHECK(backward == 0.0);
    }
  }
}

TEST_CASE("built-in model parameters beyond any integer are refused, not converted", "[model]") {
  // A double outside int64's range converted to an integer is undefined behaviour: checked as doubles first.
  CHECK_THROWS_WITH(builtin_model_spec("deep-mlp:depth=16,width=2.6e125"),
                    Catch::Contains("width must be an integer in [1, 65536]"));
  CHECK_THROWS_WITH(builtin_model_spec("deep-mlp:depth=-1e300"), Catch::Contains("depth must be an integer in [1, 1000]"));
  CHECK_THROWS_WITH(builtin_model_spec("resnet-mini:n=1e30"), Catch::Contains("n must be an integer in [1, 64]"));
  CHECK_THROWS_WITH(builtin_model_spec("deep-mlp:width=nan"), Catch::Contains("width must be an integer"));
  CHECK_NOTHROW(builtin_model_spec("deep-mlp:depth=2,width=8"));
}
