// Tests of `gradscale inspect` through the built binary on the hand-written fixture
// tests/data/trace_by_hand.json, whose per-layer numbers are worked out by hand, and on its .jsonl twin
// cut as a run that died leaves it: --json, the printed table, and --at.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli_run.h"
#include "tests/trace_tools_fixtures.h"

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_cli;
using gradscale::test::run_shell;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace gradscale::test::trace_tools_fixtures;

// The fixture, by hand (S = s * S_in; log2 S uses S_in for fc1, which sends no activation gradient;
// rate = underflow / (elements - zero - nonfinite)):
//   step  S0    fc1 S_in  relu1 S / rate        fc2 S / rate            loss_grad rate
//   10    1024  4096      4096  4/16   = 0.25   4096  2/32    = 0.0625  0/24 = 0
//   13    1024  (absent)  4096  0/15   = 0 (*)  4096  0/31    = 0 (*)   3/24 = 0.125
//   14    512   1024      1024  8/16   = 0.5    1024  4/32    = 0.125   6/24 = 0.25
//   20    512   4096 (*)  4096  0/0 -> 0        4096  1/32    = 0.03125 5/20 = 0.25
// (*) an overflow event: step 13 has an overflow and a non-finite value in the act gradients of relu1
// and fc2 (and non-finite values in fc2's wgrad: still one event); step 20 an overflow in fc1's wgrad.
// The .jsonl twin holds steps 10, 13 and 14 and a cut line of step 20, and no summary.
TEST_CASE("inspect --json gives the hand-computed per-layer numbers of the fixture", "[cli][trace]") {
  const json j = inspect_json(kData + "trace_by_hand.json");
  CHECK(j["schema"] == "gradscale.trace/1");
  CHECK(j["model"] == "tiny-mlp");
  CHECK(j["format"] == "fp16");
  CHECK(j["grad_format"] == "fp16");
  CHECK(j["policy"] == "adaptive");
  CHECK(j["finished"] == true);
  CHECK(j["steps"] == 20);
  CHECK(j["traced_steps"] == 4);
  CHECK(j["last_traced_step"] == 20);
  CHECK(j["skipped"] == 1);
  CHECK(j["overflows"] == 1);
  CHECK(j["test_accuracy"].get<double>() == 0.5);
  CHECK(j["test_loss"].get<double>() == 1.25);
  CHECK(j["wall_seconds"].get<double>() == 0.75);
  CHECK(j["scaler_seconds"].get<double>() == 0.0625);
  CHECK(j["warnings"].empty());
  const json& layers = j["layers"];
  REQUIRE(layers.size() == 4);
  CHECK(layers[0]["name"] == "flatten");
  check_no_records(layers[0]);
  // fc1: log2 S_in 12, 10, 12.
  check_row(layers[1], {3, 34.0 / 3, 10, 12, 0, 0, false, 1});
  // relu1 and fc2: log2 S 12, 12, 10, 12 -> mean 11.5.
  check_row(layers[2], {4, 11.5, 10, 12, (0.25 + 0 + 0.5 + 0) / 4, 0.5, true, 1});
  check_row(layers[3], {4, 11.5, 10, 12, (0.0625 + 0 + 0.125 + 0.03125) / 4, 0.125, true, 1});
  // The loss gradient: log2 S0 10, 10, 9, 9.
  CHECK(j["loss"]["name"] == "loss");
  check_row(j["loss"], {4, 9.5, 9, 10, (0 + 0.125 + 0.25 + 0.25) / 4, 0.25, true, 0});
}

TEST_CASE("inspect reads the .jsonl of a run that died: cut last line is a warning", "[cli][trace]") {
  const json j = inspect_json(kData + "trace_by_hand.jsonl");
  CHECK(j["finished"] == false);
  CHECK(j["steps"].is_null());
  CHECK(j["traced_steps"] == 3);
  CHECK(j["last_traced_step"] == 14);
  CHECK(j["skipped"] == 1);
  CHECK(j["overflows"] == 1);
  CHECK(j["test_accuracy"].is_null());
  CHECK(j["wall_seconds"].is_null());
  REQUIRE(j["warnings"].size() == 1);
  CHECK_THAT(j["warnings"][0].get<std::string>(), Contains("line 5 is not valid JSON"));
  const json& layers = j["layers"];
  check_no_records(layers[0]);
  check_row(layers[1], {2, 11, 10, 12, 0, 0, false, 0});
  check_row(layers[2], {3, 34.0 / 3, 10, 12, (0.25 + 0 + 0.5) / 3, 0.5, true, 1});
  check_row(layers[3], {3, 34.0 / 3, 10, 12, (0.0625 + 0 + 0.125) / 3, 0.125, true, 1});
  check_row(j["loss"], {3, 29.0 / 3, 9, 10, (0 + 0.125 + 0.25) / 3, 0.25, true, 0});

  const CliResult text = run_cli("inspect " + kData + "trace_by_hand.jsonl");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.lines[0], Contains("warning:"));
  CHECK_THAT(text.lines[0], Contains("line 5 is not valid JSON"));
  CHECK_THAT(text.lines.back(), Contains("run did not finish: last traced step 14"));
}

TEST_CASE("inspect prints the header, one row per layer, the loss row and the run totals", "[cli][trace]") {
  const CliResult r = run_cli("inspect " + kData + "trace_by_hand.json");
  REQUIRE(r.status == 0);
  REQUIRE(r.lines.size() == 8);
  CHECK_THAT(r.lines[0], Contains("gradscale.trace/1, model tiny-mlp, format fp16, grad_format fp16, "
                                  "scaler adaptive, 20 steps, 4 traced steps"));
  CHECK(r.lines[2] ==
        "0    flatten flatten       0           -       -       -              -          -         -");
  CHECK(r.lines[3] ==
        "1    fc1     linear        3      11.333  10.000  12.000              -          -         1");
  CHECK(r.lines[4] ==
        "2    relu1   relu          4      11.500  10.000  12.000      1.875e-01  5.000e-01         1");
  CHECK(r.lines[6] ==
        "-    loss    loss          4       9.500   9.000  10.000      1.562e-01  2.500e-01         0");
  CHECK(r.lines[7] ==
        "run: 20 steps, 4 traced, 1 skipped, 1 overflows (found_inf); test accuracy 0.5000, "
        "test loss 1.2500; wall 0.75 s, scaler 0.0625 s");
}

TEST_CASE("inspect --at shows the traced step nearest to STEP", "[cli][trace]") {
  // Traced steps 10, 13, 14, 20: 15 is nearest to 14; 17 is as near to 14 as to 20 (the earlier wins).
  json j = inspect_json(kData + "trace_by_hand.json --at 15");
  const json& at = j["at"];
  CHECK(at["requested"] == 15);
  CHECK(at["step"] == 14);
  CHECK(at["S0"] == 512);
  CHECK(at["why"] == json::array({"scale_change"}));
  REQUIRE(at["layers"].size() == 4);
  CHECK(at["layers"][0]["traced"] == false);
  CHECK(at["layers"][1]["S"].get<double>() == 1024);  // S_in: fc1 sends no activation gradient
  CHECK(at["layers"][1]["underflow_rate"].is_null());
  CHECK(at["layers"][2]["underflow_rate"].get<double>() == 0.5);
  CHECK(at["layers"][3]["s"] == 2);
  CHECK(at["layers"][3]["S"].get<double>() == 1024);
  CHECK(at["layers"][3]["log2_S"].get<double>() == 10);
  CHECK(at["layers"][3]["underflow_rate"].get<double>() == 0.125);
  CHECK(at["loss_grad"]["underflow_rate"].get<double>() == 0.25);
  CHECK(at["loss_grad"]["log2_S"].get<double>() == 9);

  CHECK(inspect_json(kData + "trace_by_hand.json --at 12")["at"]["step"] == 13);
  CHECK(inspect_json(kData + "trace_by_hand.json --at 0")["at"]["step"] == 10);
  CHECK(inspect_json(kData + "trace_by_hand.json --at 17")["at"]["step"] == 14);  // tie: the earlier
  j = inspect_json(kData + "trace_by_hand.json --at 13");
  CHECK(j["at"]["found_inf"] == true);
  CHECK(j["at"]["layers"][3]["overflow"] == 4);  // act: 1 overflow + 1 non-finite; wgrad: 2 non-finite
  CHECK(j["at"]["layers"][1]["traced"] == false);

  const CliResult text = run_cli("inspect " + kData + "trace_by_hand.json --at 500");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.lines[1],
             Contains("step 20 (the traced step nearest to 500), epoch 1, loss 1.125, S0 512"));
  CHECK(text.lines[6] == "3    fc2     linear          8         4096   12.000  3.125e-02        0");
}
