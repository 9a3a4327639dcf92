// A trace written through the API names its model: Model::name goes into the trace
// header's "model", which `gradscale inspect --check` shows, with no "model" key in the run's config.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "tests/cli_run.h"
#include "tests/precision_fp16.h"
#include "tests/small_net_fixture.h"

using namespace gradscale;
using gradscale::testing::fp16;
using json = nlohmann::json;
using Catch::Matchers::Contains;

TEST_CASE("a trace written through the API names its model (Model::name) without a config key", "[api][trace]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradscale_trace_name_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::unique_ptr<Model> net = testing::small_conv_net("named-net", 2);
  std::unique_ptr<Optimizer> adam = make_optimizer({{"name", "adam"}});
  ScaledTraining t(*net, *adam, fp16(), json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"},
                                             {"cast_form", "measured"}}, 2);
  const json header = t.trace_header({{"batch", 16}});
  CHECK(header.at("model") == "named-net");
  CHECK_FALSE(header.at("config").contains("model"));

  const DataSplit data = load_data("synthetic:64", 2);
  Batcher batches(data.train, 16, 2);
  TraceWriter trace((dir / "run").string(), header, 1, false);
  Tensor x;
  std::vector<std::int32_t> y;
  while (batches.next(x, y)) {
    t.begin_step(true);
    const Tensor& logits = t.forward(x);
    t.loss_backward(logits, y, t.loss_scale(logits, y));
    const StepResult r = t.step(1e-3);
    trace.write_step({r.step, 1, r.loss, r.loss_scale, r.phi, r.skipped}, t.monitor());
  }
  trace.finish({{"train_loss", 1.0}, {"train_accuracy", 0.5}, {"test_loss", 2.0},
                {"test_accuracy", 0.25}, {"wall_seconds", 1.0}, {"scaler_seconds", 0.0}});
  // --check accepts it (its one line, "ok: ...", is unchanged); inspect's header line and --json name it.
  const test::CliResult c = test::run_cli("inspect --check " + test::shell_quote((dir / "run.json").string()));
  CHECK(c.status == 0);
  REQUIRE_FALSE(c.lines.empty());
  CHECK_THAT(c.lines[0], Contains("ok: "));
  const test::CliResult r = test::run_cli("inspect " + test::shell_quote((dir / "run.json").string()));
  CHECK(r.status == 0);
  REQUIRE_FALSE(r.lines.empty());
  CHECK_THAT(r.lines[0], Contains("gradscale.trace/1, model named-net, format fp16"));
  const test::CliResult j = test::run_cli("inspect --json " + test::shell_quote((dir / "run.json").string()));
  CHECK(j.status == 0);
  const json doc = json::parse(j.lines.at(0));
  CHECK(doc.dump().find("\"model\":\"named-net\"") != std::string::npos);

  // A model without a name: the run config's "model", as before; neither: "-".
  std::unique_ptr<Model> unnamed = testing::small_conv_net("", 2);
  ScaledTraining u(*unnamed, *adam, fp16(), json("none"), 2);
  CHECK(u.trace_header({{"model", "from-config"}}).at("model") == "from-config");
  CHECK_FALSE(u.trace_header().contains("model"));
  // build_model takes the spec's "name".
  Rng rng(0);
  CHECK(build_model(builtin_model_spec("cnn"), rng)->name() == "cnn");
  CHECK_THROWS_WITH(build_model(json::parse(R"({"name": 3, "input": [4], "layers": [{"type": "linear", "out": 2}]})"), rng),
                    Contains("\"name\" must be a string"));
  std::filesystem::remove_all(dir);
}
