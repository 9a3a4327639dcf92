// The trace header written once (make_trace_header, lib/train/scaled_training.h): the C++ engine's
// (ScaledTraining::trace_header) and a backward computed elsewhere (ExternalBackward::trace_header) give
// the same header for the same model, formats, scaler and seed.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include <gradscale/gradscale.h>

#include "tests/precision_fp16.h"
#include "tests/small_net_fixture.h"

using namespace gradscale;
using gradscale::testing::fp16;
using json = nlohmann::json;

TEST_CASE("trace header: ExternalBackward's equals the engine's for the same model, scaler and seed",
          "[trace][external]") {
  std::unique_ptr<Model> net = testing::small_conv_net("", 3);
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
  std::unique_ptr<Model> named = testing::small_conv_net("named-net", 3);
  ScaledTraining engine(*named, *sgd, fp16(), json("none"), 1);
  const json config = {{"model", "from-config"}};
  CHECK(engine.trace_header(config) ==
        make_trace_header(config, fp16(), engine.scaler().config(), 1, named->layer_table(), "named-net"));
  CHECK(engine.trace_header(config).at("model") == "named-net");
  CHECK_THROWS_AS(make_trace_header(json::array(), fp16(), json::object(), 1, json::array(), ""),
                  ConfigError);
}
