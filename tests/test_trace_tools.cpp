// Tests of the trace readers, through the built binary and the script: `gradscale inspect` on the
// hand-written fixture tests/data/trace_by_hand.json (and its .jsonl twin, cut as a run that died
// leaves it), whose per-layer numbers are worked out by hand below, and on tests/data/trace_small.json,
// the trace of a short real run (tests/data/make_trace_small.sh); `inspect --check` on broken variants
// of them; and scripts/plot_trace.py, which skips itself visibly (exit 4) when /usr/bin/python3 has no
// matplotlib.
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

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_cli;
using gradscale::test::run_shell;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(GRADSCALE_SOURCE_DIR) + "/tests/data/";
const std::string kPython = "/usr/bin/python3";

// A fresh directory under the system temp directory, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() /
           ("gradscale_trace_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return json::parse(in);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// The one line of `inspect --json` that holds the JSON object (warnings go to stderr).
json inspect_json(const std::string& arguments) {
  const CliResult r = run_cli("inspect " + arguments + " --json");
  REQUIRE(r.status == 0);
  for (const std::string& line : r.lines)
    if (!line.empty() && line.front() == '{') return json::parse(line);
  FAIL("no JSON object in the output of inspect " << arguments);
  return {};
}

// Skips the running test visibly. Under ctest (one test per process, selected by name) it exits with
// status 4, which tests/CMakeLists.txt declares as SKIP_RETURN_CODE; in a run of the whole binary it
// warns and returns, so the other tests still run.
void skip_test(const std::string& reason) {
  if (Catch::getCurrentContext().getConfig()->hasTestFilters()) {
    std::cout << "SKIPPED: " << reason << std::endl;
    std::cerr.flush();
    std::_Exit(4);
  }
  WARN("SKIPPED: " << reason);
}

bool is_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == std::string("\x89PNG\r\n\x1a\n", 8);
}

struct Expected {
  std::size_t records;
  double log2_mean, log2_min, log2_max;
  double rate_mean, rate_max;  // ignored when rated is false
  bool rated;
  std::size_t overflow_events;
};

void check_row(const json& row, const Expected& e) {
  INFO(row.dump());
  CHECK(row["records"] == e.records);
  REQUIRE(row["log2_S"].is_object());
  CHECK(row["log2_S"]["mean"].get<double>() == e.log2_mean);
  CHECK(row["log2_S"]["min"].get<double>() == e.log2_min);
  CHECK(row["log2_S"]["max"].get<double>() == e.log2_max);
  if (e.rated) {
    REQUIRE(row["underflow_rate"].is_object());
    CHECK(row["underflow_rate"]["mean"].get<double>() == e.rate_mean);
    CHECK(row["underflow_rate"]["max"].get<double>() == e.rate_max);
  } else {
    CHECK(row["underflow_rate"].is_null());
  }
  CHECK(row["overflow_events"] == e.overflow_events);
}

void check_no_records(const json& row) {
  INFO(row.dump());
  CHECK(row["records"] == 0);
  CHECK(row["log2_S"].is_null());
  CHECK(row["underflow_rate"].is_null());
  CHECK(row["overflow_events"].is_null());
}

// Writes `doc` to a file in `dir`, runs `inspect --check` on it and requires exit 1 with one line that
// contains every one of `parts`.
void require_rejected(const TempDir& dir, const json& doc, const std::vector<std::string>& parts) {
  const std::string path = dir.file("broken.json");
  write_text(path, doc.dump(1));
  const CliResult r = run_cli("inspect --check '" + path + "'");
  INFO("output: " << (r.lines.empty() ? std::string("(none)") : r.lines.front()));
  CHECK(r.status == 1);
  REQUIRE(r.lines.size() == 1);
  CHECK_THAT(r.lines[0], Contains("gradscale inspect: " + path + ": "));
  for (const std::string& p : parts) CHECK_THAT(r.lines[0], Contains(p));
}

}  // namespace

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

// The pieces of the plots a reader must be able to trust, without matplotlib: the title names the
// gradient format too, and the heat map's columns are the steps with statistics only (a "stats": false
// record is no grey stripe), its skips and overflows marked on the axis.
TEST_CASE("plot_trace.py titles both formats and maps only the steps with statistics", "[trace][plot]") {
  if (access(kPython.c_str(), X_OK) != 0) return skip_test(kPython + " not found (install python3)");
  const TempDir dir;
  write_text(dir.file("probe.py"), R"(import sys
sys.path.insert(0, sys.argv[1])
import plot_trace as p
header = {"format": "fp16", "grad_format": "fp8_e5m2", "config": {"model": "cnn"},
          "scaler": {"policy": "adaptive"}}
print(p.plot_title("run", header))
steps = [{"step": 10}, {"step": 13, "stats": False, "skipped": True, "found_inf": True},
         {"step": 15, "stats": False, "found_inf": True}, {"step": 20, "stats": True}]
print([st["step"] for st in p.statistics_steps(steps)])
print(p.event_steps(steps))
)");
  const CliResult r =
      run_shell(kPython + " '" + dir.file("probe.py") + "' '" + GRADSCALE_SOURCE_DIR + "/scripts'");
  REQUIRE(r.status == 0);
  REQUIRE(r.lines.size() == 3);
  CHECK(r.lines[0] == "run: cnn, fp16 / grad fp8_e5m2, scaler adaptive");
  CHECK(r.lines[1] == "[10, 20]");
  CHECK(r.lines[2] == "([13], [13, 15])");
}

TEST_CASE("plot_trace.py draws the scales, underflow and loss PNGs of the fixture", "[trace][plot]") {
  if (access(kPython.c_str(), X_OK) != 0) return skip_test(kPython + " not found (install python3)");
  if (run_shell(kPython + " -c 'import matplotlib'").status != 0)
    return skip_test(kPython + " has no matplotlib (install python3-matplotlib, or run scripts/setup.sh)");
  const std::string script = std::string(GRADSCALE_SOURCE_DIR) + "/scripts/plot_trace.py";
  const TempDir dir;
  for (const char* name : {"trace_small.json", "trace_small.jsonl"}) {
    const std::string out = dir.file(name);  // one directory per input
    const CliResult r = run_shell(kPython + " " + script + " " + kData + name + " --out '" + out + "'");
    INFO(name);
    REQUIRE(r.status == 0);
    std::vector<std::string> written;
    for (const std::string& line : r.lines)
      if (line.find("warning") == std::string::npos) written.push_back(line);
    REQUIRE(written.size() == 3);
    for (const char* kind : {"scales", "underflow", "loss"}) {
      const std::string png = out + "/trace_small." + kind + ".png";
      CHECK(std::find(written.begin(), written.end(), png) != written.end());
      REQUIRE(fs::exists(png));
      CHECK(fs::file_size(png) > 1000);
      CHECK(is_png(png));
    }
  }
  const CliResult missing = run_shell(kPython + " " + script + " '" + dir.file("absent.json") + "'");
  CHECK(missing.status == 1);
  REQUIRE(missing.lines.size() == 1);
  CHECK_THAT(missing.lines[0], Contains("plot_trace.py: error:"));
  CHECK_THAT(missing.lines[0], Contains("absent.json: cannot read"));
  write_text(dir.file("bad.json"), "{\"schema\": ");
  const CliResult bad = run_shell(kPython + " " + script + " '" + dir.file("bad.json") + "'");
  CHECK(bad.status == 1);
  REQUIRE(bad.lines.size() == 1);
  CHECK_THAT(bad.lines[0], Contains("bad.json: not valid JSON"));
}
