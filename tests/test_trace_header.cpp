// The trace header written once (make_trace_header, lib/train/scaled_training.h): the C++ engine's
// (ScaledTraining::trace_header) and a backward computed elsewhere (ExternalBackward::trace_header) give
// the same header for the same model, formats, scaler and seed.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include <gradscale/gradscale.h>

#include "tests/precision_fp16.h"

using namespace gradscale;
using gradscale::testing::fp16;
using json = nlohmann::json;

namespace {

// conv → ReLU → flatten → linear, named when `name` is not empty.
std::unique_ptr<Model> header_net(const std::string& name) {
  Rng rng(3);
  const InitSpec init;
  auto net = std::make_unique<Model>(name);
  const int c = net->add(std::make_unique<Conv2d>("c", 1, 4, 3, 2, 1, true, init, rng), {Model::kModelInput});
  const int r = net->add(std::make_unique<ReLU>("r"), {c});
  const int f = net->add(std::make_unique<Flatten>("f"), {r});
  net->add(std::make_unique<Linear>("fc", 4 * 14 * 14, 10, true, init, rng), {f});
  net->finalize({1, 28, 28});
  return net;
}

}  // namespace

TEST_CASE("trace header: ExternalBackward's equals the engine's for the same model, scaler and seed",
          "[trace][external]") {
  std::unique_ptr<Model> net = header_net("");
  std::unique_ptr<Optimizer> sgd = make_optimizer({{"name", "sgd"}});
  for (const json& scaler : {json("none"), json("static:1024"),
                             json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}}}) {
    ScaledTraining engine(*net, *sgd, fp16(), scaler, 7);
    ExternalBackward external(net->layer_infos(), fp16(), scaler);
    const json config = {{"model", "from-config"}, {"batch", 16}};
    const json header = external.trace_header(config, 7, net->layer_table());
    CHECK(header == engine.trace_header(config));
    CHECK(header.at("model") == "from-config");
    CHECK(header.at("seed") == 7);
    CHECK(header.at("grad_format") == "fp16");
    CHECK(header.at("scaler") == external.scaler().config());
    CHECK_FALSE(external.trace_header(json::object(), 7, net->layer_table()).contains("model"));
  }
  // A named model: the engine's name wins over the config's; make_trace_header takes it as an argument.
  std::unique_ptr<Model> named = header_net("named-net");
  ScaledTraining engine(*named, *sgd, fp16(), json("none"), 1);
  const json config = {{"model", "from-config"}};
  CHECK(engine.trace_header(config) ==
        make_trace_header(config, fp16(), engine.scaler().config(), 1, named->layer_table(), "named-net"));
  CHECK(engine.trace_header(config).at("model") == "named-net");
  CHECK_THROWS_AS(make_trace_header(json::array(), fp16(), json::object(), 1, json::array(), ""),
                  ConfigError);
}
