// The public API as a user's program sees it: only <gradscale/gradscale.h> is included. A loop of one's
// own through ScaledTraining gives the same bits as Trainer; a controller written here, outside the
// library, is registered by name and drives the Trainer; a scaler's state survives save and load in the
// middle of an update_every interval; misuse is refused with messages that say what to do; the CLI and
// the headers report the project's version.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "tests/cli_run.h"
#include "tests/weight_bits.h"

using namespace gradscale;
using gradscale::testing::weight_bits;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// A residual fork, dropout (draws from the dropout generator) and both parametric kinds.
json residual_spec() {
  return json::parse(R"({"name": "api-res", "input": [1, 28, 28], "layers": [
    {"type": "conv2d", "name": "c1", "out": 4, "kernel": 3, "padding": 1, "stride": 2},
    {"type": "relu", "name": "r1"},
    {"type": "conv2d", "name": "c2", "out": 4, "kernel": 3, "padding": 1},
    {"type": "add", "name": "j", "inputs": ["c2", "r1"]},
    {"type": "dropout", "name": "d", "p": 0.25},
    {"type": "flatten", "name": "f"},
    {"type": "linear", "name": "fc", "out": 10}]})");
}

TrainConfig small_config(const json& scaler) {
  TrainConfig c;
  c.model = "api-res";
  c.model_spec = residual_spec();
  c.data = "synthetic:256";
  c.batch = 64;
  c.epochs = 2;
  c.threads = 1;
  c.seed = 5;
  c.format = Format::fp16;
  c.scaler = scaler;
  return c;
}

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradscale_api_" + name + "_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(dir);
  return dir.string();
}

// A user's own training setup: the network from the spec and seed, Adam, fp16, the scaler attached by config.
struct OwnSetup {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<ScaledTraining> training;
  OwnSetup(const TrainConfig& c, const json& scaler) {
    Rng rng(c.seed);
    model = build_model(c.model_spec, rng);
    optimizer = make_optimizer({{"name", "adam"}});
    Precision p;
    p.format = c.format;
    training = std::make_unique<ScaledTraining>(*model, *optimizer, p, scaler, c.seed);
  }
  StepResult step(const Tensor& x, const std::vector<std::int32_t>& y, double lr) {
    ScaledTraining& t = *training;
    t.begin_step();
    const Tensor& logits = t.forward(x);
    const double s0 = t.loss_scale(logits, y);
    t.loss_backward(logits, y, s0);
    return t.step(lr);
  }
};

// A per-layer policy written by a user, outside the library: S0 = "s0", every Linear / Conv2d doubles
// the gradient it sends upstream (exact in binary formats), skip on overflow. It counts its decisions.
class DoublingScaler final : public Scaler, public LayerController {
 public:
  explicit DoublingScaler(double s0) : s0_(s0) {}
  std::string policy() const override { return "test_doubling"; }
  double loss_scale() const override { return s0_; }
  LayerController* layer_controller() override { return this; }
  StepReport update(const StepStatistics& stats) override { return {stats.found_inf, s0_, state()}; }
  json config() const override { return {{"policy", "test_doubling"}, {"s0", s0_}}; }
  json state() const override { return {{"decisions", decisions_}}; }
  void restore_state(const json& state) override { decisions_ = state.at("decisions"); }

  void bind(const std::vector<LayerInfo>& layers, Format) override { layers_ = layers.size(); }
  void begin_step(const StepBegin& b) override { step_ = b.step; }
  StatNeeds needs(int) const override { return kNeedUpstreamStats; }
  LocalScale decide(const LocalScaleQuery& q) override {
    GS_CHECK(q.upstream_stats != nullptr && q.step == step_, "the engine did not honour needs()");
    ++decisions_;
    return {2.0, 2.0};
  }
  void end_step(const StepMonitor&) override {}
  std::size_t bound_layers() const { return layers_; }

 private:
  double s0_;
  std::int64_t decisions_ = 0, step_ = -1;
  std::size_t layers_ = 0;
};

void register_doubling_once() {
  static const bool registered = [] {
    register_scaler(
        "test_doubling",
        [](const json& config, Format) -> std::unique_ptr<Scaler> {
          for (const auto& [key, value] : config.items())
            GS_CHECK_CONFIG(key == "policy" || key == "s0",
                            "scaler 'test_doubling': unknown key '" << key << "'");
          return std::make_unique<DoublingScaler>(config.value("s0", 1.0));
        },
        ScalerKind::per_layer);
    return true;
  }();
  (void)registered;
}

}  // namespace

TEST_CASE("an own loop through ScaledTraining gives bit-identical weights to Trainer", "[api]") {
  const std::vector<json> scalers = {
      {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"update_every", 3}},
      {{"policy", "torch"}, {"init_scale", 1 << 20}, {"growth_interval", 3}},  // skips at first
      {{"policy", "none"}}};
  for (const json& sc : scalers) {
    INFO(sc.dump());
    const TrainConfig c = small_config(sc);
    Trainer trainer(c);
    trainer.run();

    // The same run as a user writes it: own model, optimizer, data order and loop.
    const DataSplit data = load_data(c.data, c.seed);
    OwnSetup own(c, sc);
    Batcher batches(data.train, c.batch, c.seed);
    Tensor x;
    std::vector<std::int32_t> y;
    std::int64_t skipped = 0;
    for (std::int64_t epoch = 0; epoch < c.epochs; ++epoch)
      while (batches.next(x, y)) skipped += own.step(x, y, c.lr).skipped;

    CHECK(own.training->steps() == trainer.training().steps());
    CHECK(own.training->steps() == 8);
    CHECK(weight_bits(*own.model) == weight_bits(trainer.model()));
    CHECK(own.training->scaler().state() == trainer.scaler().state());
    CHECK(own.optimizer->step_count() == trainer.optimizer().step_count());
    CHECK(own.optimizer->step_count() == own.training->steps() - skipped);
    if (sc["policy"] == "torch") CHECK(skipped > 0);  // 2^20 overflows fp16: the skip path ran
  }
}

TEST_CASE("a controller defined outside the library is registered by name and used by Trainer", "[api]") {
  register_doubling_once();
  const std::vector<std::string> names = scaler_policies();
  CHECK(std::find(names.begin(), names.end(), "test_doubling") != names.end());
  CHECK_THROWS_WITH(make_scaler(json{{"policy", "no_such_policy"}}, Format::fp16),
                    Contains("per-layer: ") && Contains("test_doubling"));

  TrainConfig c = small_config({{"policy", "test_doubling"}, {"s0", 4}});
  c.format = Format::fp32;  // powers of two are exact in fp32: the updates equal an unscaled run's
  c.model = "mlp";
  c.model_spec = json();
  c.max_steps = 3;
  Trainer trainer(c);
  trainer.run();
  CHECK(trainer.scaler().policy() == "test_doubling");
  CHECK(trainer.config().scaler == json{{"policy", "test_doubling"}, {"s0", 4.0}});
  const auto& doubling = dynamic_cast<const DoublingScaler&>(trainer.scaler());
  CHECK(doubling.bound_layers() == static_cast<std::size_t>(trainer.model().num_layers()));
  // mlp: fc1 sends no gradient upstream (nothing to train before it); fc2 and fc3 decide every step.
  CHECK(trainer.scaler().state()["decisions"] == 2 * 3);
  // Backward from S0 = 4: fc3 doubles to 8, fc2 to 16; fc1 receives 16 and sends nothing upstream.
  const std::vector<LayerScale> scales = trainer.training().layer_scales();
  REQUIRE(scales.size() == 6);
  CHECK((scales[5].name == "fc3" && scales[5].s == 2 && scales[5].scale_in == 4 && scales[5].scale_out == 8));
  CHECK(
      (scales[3].name == "fc2" && scales[3].s == 2 && scales[3].scale_in == 8 && scales[3].scale_out == 16));
  CHECK((scales[1].name == "fc1" && scales[1].ran && scales[1].scale_in == 16));
  CHECK_FALSE(scales[0].ran);  // flatten: nothing to train before it

  TrainConfig plain = c;
  plain.scaler = {{"policy", "none"}};
  Trainer unscaled(plain);
  unscaled.run();
  CHECK(weight_bits(trainer.model()) == weight_bits(unscaled.model()));

  // The same object attached by hand to an own loop.
  Rng rng(c.seed);
  std::unique_ptr<Model> model = build_model(builtin_model_spec("mlp"), rng);
  std::unique_ptr<Optimizer> sgd = make_optimizer("sgd");
  ScaledTraining t(*model, *sgd, Precision{}, std::make_unique<DoublingScaler>(8.0));
  const DataSplit data = load_data("synthetic:64", 1);
  t.begin_step();
  const Tensor& logits = t.forward(data.train.images);
  CHECK(t.loss_scale(logits, data.train.labels) == 8);
  t.loss_backward(logits, data.train.labels, 8);
  CHECK_FALSE(t.step(0.1).skipped);
  CHECK(t.scaler().state()["decisions"] == 2);
}

TEST_CASE("a scaler's state survives save and load in the middle of an update_every interval",
          "[api][checkpoint]") {
  const json sc = {
      {"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"update_every", 5}};
  const TrainConfig c = small_config(sc);
  const DataSplit data = load_data(c.data, c.seed);
  Batcher batches(data.train, c.batch, c.seed);
  std::vector<Tensor> xs;
  std::vector<std::vector<std::int32_t>> ys;
  for (int i = 0; i < 12; ++i) {
    Tensor x;
    std::vector<std::int32_t> y;
    if (!batches.next(x, y)) REQUIRE(batches.next(x, y));
    xs.push_back(x);
    ys.push_back(y);
  }

  OwnSetup whole(c, sc);
  std::vector<StepResult> expected;
  for (int i = 0; i < 12; ++i) expected.push_back(whole.step(xs[i], ys[i], c.lr));

  const std::string dir = temp_dir("mid_interval");
  json saved_state;
  {
    OwnSetup first(c, sc);
    for (int i = 0; i < 7; ++i) first.step(xs[i], ys[i], c.lr);
    saved_state = first.training->scaler().state();
    // Statistics were last computed at step 5: step 7 is inside the interval, the cache is in use.
    for (const json& layer : saved_state["layers"]) CHECK(layer["computed_at"] == 5);
    REQUIRE(saved_state["layers"].size() >= 2);
    first.training->save(dir, {{"note", "mine"}});
  }
  OwnSetup second(c, sc);
  const json meta = second.training->load(dir);
  CHECK(meta["note"] == "mine");
  CHECK(second.training->steps() == 7);
  CHECK(second.training->scaler().state() == saved_state);
  for (int i = 7; i < 12; ++i) {
    const StepResult r = second.step(xs[i], ys[i], c.lr);
    INFO("step " << i + 1);
    CHECK(r.step == expected[i].step);
    CHECK(r.loss_scale == expected[i].loss_scale);
    CHECK(r.report.state == expected[i].report.state);
  }
  CHECK(weight_bits(*second.model) == weight_bits(*whole.model));
  CHECK(second.training->scaler().state() == whole.training->scaler().state());
  std::filesystem::remove_all(dir);
}

TEST_CASE("ScaledTraining refuses misuse with a message that says what to do", "[api]") {
  const json sc = {{"policy", "static"}, {"scale", 8}};
  const TrainConfig c = small_config(sc);
  OwnSetup own(c, "static:8");  // command-line text works as a JSON string
  CHECK(own.training->scaler().config()["scale"] == 8.0);
  const DataSplit data = load_data("synthetic:64", 1);
  ScaledTraining& t = *own.training;
  CHECK_THROWS_WITH(t.forward(data.train.images),
                    Contains("begin_step, forward, loss_scale, loss_backward, step"));
  t.begin_step();
  const Tensor& logits = t.forward(data.train.images);
  CHECK_THROWS_WITH(t.step(0.1), Contains("ScaledTraining::step is called after forward()"));
  CHECK_THROWS_AS(t.loss_backward(logits, data.train.labels, 0.0), NumericError);
  std::vector<std::int32_t> short_labels(3, 0);
  CHECK_THROWS_AS(t.loss_backward(logits, short_labels, 8.0), ShapeError);
  CHECK_THROWS_WITH(t.save(temp_dir("inside")), Contains("inside an iteration"));
  t.loss_backward(logits, data.train.labels, 8.0);
  CHECK_THROWS_AS(t.step(-1.0), ConfigError);
  const StepResult r = t.step(1e-3);
  CHECK(r.step == 1);
  CHECK(r.loss_scale == 8);

  const std::string dir = temp_dir("refuse");
  CHECK_THROWS_WITH(t.save(dir, {{"steps", 3}}), Contains("may not use the key 'steps'"));
  t.save(dir);
  TrainConfig other = c;
  other.model_spec["layers"][2]["out"] = 8;  // c2: 8 channels instead of 4
  other.model_spec["layers"][3]["inputs"] = json::array({"c2", "c2"});
  OwnSetup different(other, sc);
  CHECK_THROWS_WITH(different.training->load(dir),
                    Contains("another model or format") && Contains("layer 2 'c2' (conv2d [4, 4, 3, 3])"));
  OwnSetup torch(c, {{"policy", "torch"}});
  CHECK_THROWS_WITH(torch.training->load(dir), Contains("used scaler"));
  CHECK_THROWS_AS(ScaledTraining(*torch.model, *torch.optimizer, Precision{}, json{{"policy", "nope"}}),
                  ConfigError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the version: gradscale --version, GRADSCALE_VERSION and gradscale/version.h agree", "[api][cli]") {
  const test::CliResult r = test::run_cli("--version");
  CHECK(r.status == 0);
  REQUIRE(r.lines.size() == 1);
  CHECK(r.lines[0] == std::string("gradscale ") + GRADSCALE_VERSION);
  CHECK(std::string(kVersion) == GRADSCALE_VERSION);
  CHECK(std::to_string(GRADSCALE_VERSION_MAJOR) + "." + std::to_string(GRADSCALE_VERSION_MINOR) + "." +
            std::to_string(GRADSCALE_VERSION_PATCH) ==
        GRADSCALE_VERSION);
}

namespace {

std::string read_source_file(const std::string& path) {
  std::ifstream in(std::string(GRADSCALE_SOURCE_DIR) + "/" + path);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The lines strictly between "// README begin" and "// README end" in `source`, each marker on a line
// of its own; empty when either marker is missing, repeated or out of order.
std::string readme_excerpt(const std::string& source) {
  const std::string begin = "// README begin\n", end = "// README end\n";
  const std::size_t b = source.find(begin), e = source.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "";
  if (source.find(begin, b + 1) != std::string::npos || source.find(end, e + 1) != std::string::npos)
    return "";
  const std::size_t from = b + begin.size(), to = source.rfind('\n', e - 1) + 1;  // the marker's line
  return to > from ? source.substr(from, to - from) : "";
}

}  // namespace

TEST_CASE(
    "the README's C++ example is the marked excerpt of experiments/examples/minimal_loop.cpp, which "
    "the install test builds, and docs/api.md shows the whole file",
    "[api][docs]") {
  const std::string readme = read_source_file("README.md"), api = read_source_file("docs/api.md"),
                    example = read_source_file("experiments/examples/minimal_loop.cpp");
  const std::string excerpt = readme_excerpt(example);
  REQUIRE(!excerpt.empty());
  CHECK(std::count(excerpt.begin(), excerpt.end(), '\n') <= 20);  // a README example, not the program
  CHECK(readme.find("```cpp\n" + excerpt + "```\n") != std::string::npos);
  CHECK(api.find("```cpp\n" + example + "```\n") != std::string::npos);
}

TEST_CASE("readme_excerpt: the lines between the markers, nothing when a marker is missing or repeated",
          "[api][docs]") {
  CHECK(readme_excerpt("a\n  // README begin\nb\nc\n  // README end\nd\n") == "b\nc\n");
  CHECK(readme_excerpt("a\n// README begin\nb\n") == "");
  CHECK(readme_excerpt("// README end\nb\n// README begin\n") == "");
  CHECK(readme_excerpt("// README begin\nb\n// README end\n// README begin\nc\n// README end\n") == "");
}
