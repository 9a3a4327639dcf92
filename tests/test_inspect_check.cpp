// Tests of `gradscale inspect --check` through the built binary: it accepts the fixtures, their .jsonl
// twins and the traces of real runs of every built-in model, and rejects broken traces, broken .jsonl
// files and bad command lines with a message naming the problem.
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

namespace {

// `inspect --check` accepts both forms of the trace at `base` (.json and .jsonl), and its last line
// holds each of `expected`.
void check_both_forms(const std::string& base, const std::vector<std::string>& expected) {
  for (const char* ext : {".json", ".jsonl"}) {
    const CliResult r = run_cli("inspect --check '" + base + ext + "'");
    INFO(ext << ": " << (r.lines.empty() ? std::string("(no output)") : r.lines.back()));
    CHECK(r.status == 0);
    REQUIRE(!r.lines.empty());
    for (const std::string& text : expected) CHECK_THAT(r.lines.back(), Contains(text));
  }
}

}  // namespace

TEST_CASE("inspect --check accepts both fixtures and their .jsonl twins", "[cli][trace]") {
  for (const char* name : {"trace_by_hand", "trace_small"}) {
    INFO(name);
    const CliResult json_doc = run_cli("inspect --check " + kData + name + ".json");
    CHECK(json_doc.status == 0);
    REQUIRE(json_doc.lines.size() == 1);
    CHECK(json_doc.lines[0] == "ok: 4 steps, 4 layers (run of 20 steps)");
    const CliResult lines = run_cli("inspect --check " + kData + name + ".jsonl");
    CHECK(lines.status == 0);
    REQUIRE(lines.lines.size() == 2);
    CHECK_THAT(lines.lines[0], Contains("warning:"));
    CHECK(lines.lines[1] == "ok: 3 steps, 4 layers (no summary: the run did not finish)");
  }
}

TEST_CASE("inspect --check rejects broken traces with a message naming the problem", "[cli][trace]") {
  const TempDir dir;
  const json good = read_json(kData + "trace_by_hand.json");

  SECTION("missing header") {
    json d = good;
    d.erase("header");
    require_rejected(dir, d, {"document: missing key 'header'"});
  }
  SECTION("wrong schema string") {
    json d = good;
    d["schema"] = "gradscale.trace/2";
    require_rejected(dir, d, {"key 'schema' is 'gradscale.trace/2', expected 'gradscale.trace/1'"});
    d = good;
    d["header"]["schema"] = "gradscale.trace/0";
    require_rejected(dir, d, {"header: key 'schema' is 'gradscale.trace/0'"});
  }
  SECTION("a step missing layers") {
    json d = good;
    d["steps"][1].erase("layers");
    require_rejected(dir, d, {"step 13 (steps[1]): missing key 'layers'"});
  }
  SECTION("a layer id outside the table") {
    json d = good;
    d["steps"][0]["layers"][2]["id"] = 7;
    require_rejected(dir, d,
                     {"step 10 (steps[0]), layers[2]", "key 'id' is 7, outside the header's layer table"});
  }
  SECTION("counts that do not sum to elements") {
    json d = good;
    d["steps"][2]["layers"][1]["act"]["normal"] = 7;
    require_rejected(dir, d,
                     {"step 14 (steps[2]), layer 2 (relu1)", "'act'", "sum to 33, not elements = 32"});
  }
  SECTION("non-monotone steps") {
    json d = good;
    d["steps"][2]["step"] = 12;
    require_rejected(dir, d, {"step 12 (steps[2])", "step 12 follows step 13: steps must increase"});
  }
  SECTION("wrong types and broken rules between fields") {
    json d = good;
    d["steps"][0]["S0"] = "1024";
    require_rejected(dir, d, {"step 10 (steps[0])", "key 'S0' must be a finite number, got string"});
    d = good;
    d["steps"][3]["layers"][2]["S"] = 2048;
    require_rejected(dir, d, {"layer 3 (fc2)", "key 'S' is 2048, but s * S_in = 8 * 512 = 4096"});
    d = good;
    d["steps"][0]["layers"][1]["act"]["underflow_rate"] = 0.5;
    require_rejected(dir, d, {"layer 2 (relu1)", "key 'act.underflow_rate' is 0.5"});
    d = good;
    d["steps"][0]["layers"][1]["wgrad"] = d["steps"][0]["layers"][1]["act"];
    require_rejected(dir, d, {"layer 2 (relu1)", "key 'wgrad' on a layer without parameters"});
    d = good;
    d["steps"][0]["loss_grad"].erase("max_abs");
    require_rejected(dir, d, {"step 10 (steps[0])", "missing key 'loss_grad.max_abs'"});
    d = good;
    d["steps"][1]["why"] = json::array({"skip", "boredom"});
    require_rejected(dir, d, {"key 'why' has \"boredom\""});
    d = good;
    d["header"]["layers"][2]["inputs"] = json::array({3});
    require_rejected(dir, d, {"header, layers[2]", "key 'inputs' has 3"});
    d = good;
    d["summary"]["skipped"] = 0;
    require_rejected(dir, d, {"summary: key 'skipped' is 0 but 1 step records are skipped"});
    d = good;
    d["summary"]["traced_steps"] = 95;
    require_rejected(dir, d, {"key 'traced_steps' is 95 but the trace has 4 step records"});
  }
}

TEST_CASE("inspect reads steps traced without statistics and warns about a summary without traced_steps",
          "[cli][trace]") {
  const TempDir dir;
  json d = read_json(kData + "trace_by_hand.json");
  // Step 13 as a notable iteration between samples: scales, no statistics.
  json& st = d["steps"][1];
  st["stats"] = false;
  st.erase("loss_grad");
  for (json& l : st["layers"]) {
    l.erase("act");
    l.erase("wgrad");
  }
  const std::string path = dir.file("nostats.json");
  write_text(path, d.dump());
  const json j = inspect_json("'" + path + "'");
  CHECK(j["warnings"].empty());
  // relu1: log2 S still over 4 records; rates and overflow events over the 3 with statistics.
  check_row(j["layers"][2], {4, 11.5, 10, 12, (0.25 + 0.5 + 0) / 3, 0.5, true, 0});
  check_row(j["loss"], {4, 9.5, 9, 10, (0 + 0.25 + 0.25) / 3, 0.25, true, 0});
  const json at = inspect_json("'" + path + "' --at 13")["at"];
  CHECK(at["stats"] == false);
  CHECK(at["layers"][3]["S"].get<double>() == 4096);
  CHECK(at["layers"][3]["underflow_rate"].is_null());
  CHECK(at["layers"][3]["overflow"].is_null());
  CHECK(at["loss_grad"]["underflow_rate"].is_null());

  st["stats"] = "no";
  require_rejected(dir, d, {"step 13 (steps[1])", "key 'stats' must be true or false"});
  st["stats"] = true;
  require_rejected(dir, d, {"step 13 (steps[1])", "missing key 'loss_grad'"});

  d = read_json(kData + "trace_by_hand.json");
  d["summary"].erase("traced_steps");
  write_text(path, d.dump());
  const CliResult r = run_cli("inspect --check '" + path + "'");
  CHECK(r.status == 0);
  REQUIRE(r.lines.size() == 2);
  CHECK_THAT(r.lines[0], Contains("warning:"));
  CHECK_THAT(r.lines[0], Contains("summary: missing key 'traced_steps'"));
  CHECK(r.lines[1] == "ok: 4 steps, 4 layers (run of 20 steps)");
}

TEST_CASE("inspect --check accepts the trace of a real run, .json and .jsonl", "[cli][trace][train]") {
  const TempDir dir;
  const std::string base = dir.file("run");
  const CliResult train = run_cli(
      "train --model mlp --data synthetic:256 --batch 8 --max-steps 30 --format fp16 --scaler torch "
      "--threads 1 --quiet --trace '" +
      base + "'");
  REQUIRE(train.status == 0);
  check_both_forms(base, {"ok: ", " steps, 6 layers (run of 30 steps)"});
  const json j = inspect_json("'" + base + ".json'");
  CHECK(j["steps"] == 30);
  CHECK(j["layers"].size() == 6);
  CHECK(j["traced_steps"].get<std::size_t>() >= 3);  // steps 10, 20, 30 at least
}

// Every built-in model (docs/models.md), BatchNorm's resnet-mini included, writes a trace that
// `inspect --check` accepts: its layer table lists BatchNorm's γ and β as parameters (with their wgrad in
// the step records) and its running statistics apart, although BatchNorm takes no local scale.
TEST_CASE("inspect --check accepts the trace of every built-in model", "[cli][trace][train]") {
  const TempDir dir;
  for (const char* model : {"mlp", "cnn", "resnet-mini", "deep-mlp"}) {
    const std::string base = dir.file(std::string("run_") + model);
    const CliResult train = run_cli(std::string("train --model ") + model +
                                    " --data synthetic:32 --batch 4 --max-steps 2 --trace-every 1 "
                                    "--format fp16 --threads 1 --quiet --trace '" +
                                    base + "'");
    INFO(model << ": " << (train.lines.empty() ? std::string("(no output)") : train.lines.back()));
    REQUIRE(train.status == 0);
    check_both_forms(base, {"ok: 2 steps"});
    if (std::string(model) != "resnet-mini") continue;
    const json trace = read_json(base + ".json");
    bool saw_batchnorm = false;
    for (const json& row : trace["header"]["layers"]) {
      if (row["kind"] != "batchnorm") continue;
      saw_batchnorm = true;
      CHECK(row["parametric"] == false);
      REQUIRE(row["parameters"].size() == 2);
      CHECK(row["parameters"][0]["name"] == row["name"].get<std::string>() + ".weight");
      REQUIRE(row["statistics"].size() == 2);
      CHECK(row["statistics"][0]["name"] == row["name"].get<std::string>() + ".running_mean");
      CHECK(row["statistics"][1]["shape"] == json::array({row["channels"]}));
      bool saw_wgrad = false;
      for (const json& l : trace["steps"][0]["layers"])
        if (l["id"] == row["id"]) saw_wgrad = l.contains("wgrad");
      CHECK(saw_wgrad);
    }
    CHECK(saw_batchnorm);
  }
}

TEST_CASE("inspect rejects broken .jsonl files and bad command lines", "[cli][trace]") {
  const TempDir dir;
  std::vector<std::string> lines;
  {
    std::ifstream in(kData + "trace_small.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  REQUIRE(lines.size() == 5);
  auto write = [&](const std::vector<std::string>& ls) {
    std::string text;
    for (const std::string& l : ls) text += l + "\n";
    write_text(dir.file("t.jsonl"), text);
    return run_cli("inspect --check '" + dir.file("t.jsonl") + "'");
  };
  // No header line: the first line is a step.
  CliResult r = write({lines[1], lines[2]});
  CHECK(r.status == 1);
  CHECK_THAT(r.lines.back(),
             Contains("line 1: the first line must be the header, found type 'step' (missing header)"));
  // A broken line before the last is an error, not a warning.
  r = write({lines[0], lines[4], lines[1]});
  CHECK(r.status == 1);
  CHECK_THAT(r.lines.back(), Contains("line 2: not valid JSON"));
  // Steps out of order.
  r = write({lines[0], lines[2], lines[1]});
  CHECK(r.status == 1);
  CHECK_THAT(r.lines.back(), Contains("step 10 (line 3): step 10 follows step 13: steps must increase"));

  r = run_cli("inspect --check '" + dir.file("absent.json") + "'");
  CHECK(r.status == 1);
  CHECK_THAT(r.lines.back(), Contains("absent.json: cannot open the trace"));
  r = run_cli("inspect " + kData + "trace_small.json --at -3");
  CHECK(r.status == 2);
  CHECK_THAT(r.lines.back(), Contains("--at: '-3' is not a step number"));
  r = run_cli("inspect --check --json " + kData + "trace_small.json");
  CHECK(r.status == 2);
  r = run_cli("inspect");
  CHECK(r.status == 2);
}
