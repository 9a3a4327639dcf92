// Tests of `gradscale ablate` (experiments/ablate): expansion of ablation files (product of axes,
// variants, seeds, scaler.* keys) and the errors that name the bad key or value before anything runs;
// resume (a finished run is skipped, a half-written one runs again); the table's mean ± std, checked
// by hand on synthetic run files and on tiny real runs; plot_ablation.py on a tiny table; and shards
// (--shard K/N, run locks, scripts/slurm_ablate.sh).
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/out_dir.h"
#include "experiments/ablate/plots.h"
#include "experiments/ablate/runner.h"
#include "experiments/ablate/shard.h"
#include "experiments/ablate/stats.h"
#include "experiments/ablate/table.h"
#include "lib/train/trace.h"
#include "lib/core/error.h"
#include "tests/cli_run.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace gradscale;
using gradscale::testing::TempDir;
using namespace gradscale::ablate;

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the ConfigError that expanding `doc` throws ("" when it does not throw).
std::string expand_error(const std::string& doc) {
  try {
    expand_ablation(ojson::parse(doc), "t.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// A tiny base: each run takes well under a second.
const char* const kTinyBase =
    R"("base": {"model": "mlp", "data": "synthetic:64", "batch": 16, "max_steps": 3, "eval_batch": 64, "trace_every": 1})";

// CSV parsed into rows of cells (no quoted commas in these tests).
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

}  // namespace

TEST_CASE("ablate: axes expand to their full product, seeds outermost", "[ablate]") {
  const Ablation ab = expand_ablation(ojson::parse(std::string("{") + kTinyBase + R"(,
      "axes": {"format": ["fp32", "fp16"],
               "scaler": ["none", "torch", {"label": "adaptive", "value": {"policy": "adaptive", "method": "measured"}}]},
      "seeds": [0, 1]})"),
                                      "t.json");
  REQUIRE(ab.runs.size() == 2 * 3 * 2);
  CHECK(ab.columns == std::vector<std::string>{"format", "scaler"});
  REQUIRE(ab.groups.size() == 6);
  // Table order: first axis outermost; run order: all configurations at seed 0 first.
  CHECK(ab.runs[0].labels == std::vector<std::string>{"fp32", "none"});
  CHECK(ab.runs[1].labels == std::vector<std::string>{"fp32", "torch"});
  CHECK(ab.runs[5].labels == std::vector<std::string>{"fp16", "adaptive"});
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(ab.runs[i].seed == 0);
    CHECK(ab.runs[i + 6].seed == 1);
    CHECK(ab.runs[i].group == ab.runs[i + 6].group);
    CHECK(ab.runs[i].config["seed"] == 0);
    CHECK(ab.runs[i + 6].config["seed"] == 1);
  }
  CHECK(ab.runs[5].name == "fp16_adaptive_seed0");
  CHECK(ab.runs[5].config["scaler"] == json{{"policy", "adaptive"}, {"method", "measured"}});
  CHECK(ab.runs[1].config["scaler"] == "torch");
  CHECK(ab.runs[1].config["max_steps"] == 3);  // the base is kept
  std::set<std::string> names;
  for (const auto& r : ab.runs) names.insert(r.name);
  CHECK(names.size() == ab.runs.size());
}

TEST_CASE("ablate: variants, alone and times the axes, a seed axis is the replicate axis", "[ablate]") {
  const Ablation ab = expand_ablation(ojson::parse(std::string("{") + kTinyBase + R"(,
      "variants": [{"label": "fp32", "format": "fp32"}, {"format": "fp16", "scaler": "torch"}],
      "axes": {"seed": [3, 4], "model": ["mlp", "deep-mlp:depth=2,width=8"]}})"),
                                      "t.json");
  CHECK(ab.columns == std::vector<std::string>{"variant", "model"});
  REQUIRE(ab.groups.size() == 4);
  REQUIRE(ab.runs.size() == 8);
  CHECK(ab.runs[0].labels == std::vector<std::string>{"fp32", "mlp"});
  CHECK(ab.runs[3].labels ==
        std::vector<std::string>{"format=fp16,scaler=torch", "deep-mlp:depth=2,width=8"});
  CHECK(ab.runs[3].name == "format=fp16-scaler=torch_deep-mlp-depth=2-width=8_seed3");
  CHECK(ab.runs[4].seed == 4);
  CHECK(ab.runs[3].config["format"] == "fp16");
  CHECK(ab.runs[3].config["scaler"] == "torch");

  // The columns follow the file: variants after the axes here.
  const Ablation after = expand_ablation(ojson::parse(std::string("{") + kTinyBase + R"(,
      "axes": {"model": ["mlp", "cnn"]}, "variants": [{"label": "a"}, {"label": "b", "lr": 0.01}]})"),
                                         "t.json");
  CHECK(after.columns == std::vector<std::string>{"model", "variant"});
  REQUIRE(after.runs.size() == 4);
  CHECK(after.runs[1].labels == std::vector<std::string>{"mlp", "b"});
  CHECK(after.runs[1].name == "mlp_b_seed0");
  CHECK(after.runs[1].config["lr"] == 0.01);

  // An axis value may set several keys at once; no two dimensions may set one key.
  const Ablation set = expand_ablation(ojson::parse(std::string("{") + kTinyBase + R"(,
      "axes": {"precision": [{"label": "fp32", "set": {"format": "fp32", "scaler": "none"}},
                             {"set": {"format": "fp16", "scaler": "torch"}}],
               "model": [{"label": "small", "set": {"model": "mlp", "epochs": 2}}]}})"),
                                       "t.json");
  CHECK(set.columns == std::vector<std::string>{"precision", "model"});
  REQUIRE(set.runs.size() == 2);
  CHECK(set.runs[0].labels == std::vector<std::string>{"fp32", "small"});
  CHECK(set.runs[1].labels == std::vector<std::string>{"format=fp16,scaler=torch", "small"});
  CHECK(set.runs[1].config["scaler"] == "torch");
  CHECK(set.runs[1].config["epochs"] == 2);
  CHECK(set.runs[0].name == "fp32_small_seed0");

  // Only seeds: one configuration, named after the base.
  const Ablation seeds =
      expand_ablation(ojson::parse(std::string("{") + kTinyBase + R"(, "seeds": [0, 1, 2]})"), "t");
  CHECK(seeds.columns.empty());
  CHECK(seeds.groups.size() == 1);
  CHECK(seeds.runs.size() == 3);
  CHECK(seeds.runs[2].name == "base_seed2");
}

TEST_CASE("ablate: scaler.* keys set a parameter inside the scaler object", "[ablate]") {
  SECTION("a policy name in the base becomes an object") {
    const Ablation ab = expand_ablation(
        ojson::parse(R"({"base": {"scaler": "torch"}, "axes": {"scaler.growth_interval": [10, 100]}})"), "t");
    REQUIRE(ab.runs.size() == 2);
    CHECK(ab.runs[0].config["scaler"] == json{{"policy", "torch"}, {"growth_interval", 10}});
    CHECK(ab.runs[1].config["scaler"] == json{{"policy", "torch"}, {"growth_interval", 100}});
    CHECK(ab.runs[0].name == "growth_interval=10_seed0");
    CHECK(ab.runs[0].labels == std::vector<std::string>{"10"});
  }
  SECTION("static:S") {
    const Ablation ab = expand_ablation(
        ojson::parse(R"({"base": {"scaler": "static:8"}, "axes": {"scaler.scale": [16]}})"), "t");
    CHECK(ab.runs[0].config["scaler"] == json{{"policy", "static"}, {"scale", 16}});
  }
  SECTION("dotted keys apply after the scaler the run ends up with, whichever comes first in the file") {
    const Ablation ab = expand_ablation(ojson::parse(R"({"axes": {"scaler.n_uf": [0.01, 1e-05],
        "scaler": [{"policy": "adaptive", "method": "measured"}, {"policy": "adaptive"}]}})"),
                                        "t");
    REQUIRE(ab.runs.size() == 4);
    CHECK(ab.runs[0].config["scaler"] ==
          json{{"policy", "adaptive"}, {"method", "measured"}, {"n_uf", 0.01}});
    CHECK(ab.runs[3].config["scaler"] == json{{"policy", "adaptive"}, {"n_uf", 1e-05}});
    CHECK(ab.runs[1].labels == std::vector<std::string>{"0.01", "adaptive"});
  }
  SECTION("variants use them too, and optimizer.* works the same way") {
    const Ablation ab =
        expand_ablation(ojson::parse(R"({"base": {"scaler": {"policy": "adaptive"}, "optimizer": "sgd"},
        "variants": [{}, {"scaler.update_every": 10}, {"label": "momentum", "optimizer.momentum": 0.9}]})"),
                        "t");
    REQUIRE(ab.runs.size() == 3);
    CHECK(ab.runs[0].labels == std::vector<std::string>{"base"});
    CHECK(ab.runs[1].labels == std::vector<std::string>{"update_every=10"});
    CHECK(ab.runs[1].config["scaler"] == json{{"policy", "adaptive"}, {"update_every", 10}});
    CHECK(ab.runs[2].config["optimizer"] == json{{"name", "sgd"}, {"momentum", 0.9}});
  }
}

TEST_CASE("ablate: a bad key or value is an error that names it", "[ablate]") {
  const auto check = [](const std::string& doc, const std::vector<std::string>& parts) {
    INFO(doc);
    const std::string e = expand_error(doc);
    INFO(e);
    REQUIRE(!e.empty());
    CHECK(contains(e, "t.json"));
    for (const auto& p : parts) CHECK(contains(e, p));
  };
  check(R"({"axes": {"lrr": [0.1]}})", {"axis 'lrr'", "unknown config key 'lrr'"});
  check(R"({"axes": {"format": ["fp16", "fp17"]}})", {"axis 'format'", "\"fp17\"", "fp17"});
  check(R"({"axes": {"scaler": ["torch", "bogus"]}})", {"axis 'scaler'", "bogus"});
  check(R"({"axes": {"model": ["resnet-huge"]}})", {"axis 'model'", "resnet-huge"});
  check(R"({"axes": {"epochs": [1, 0]}})", {"axis 'epochs' value 0", "epochs"});
  check(R"({"axes": {"lr": ["fast"]}})", {"axis 'lr'", "\"fast\""});
  // A parameter the run's scaler does not have: the run, its settings and the parameter are named.
  check(R"({"base": {"scaler": "torch"}, "axes": {"scaler.n_uf": [0.01]}})",
        {"run 'n_uf=0.01_seed0'", "scaler.n_uf=0.01", "n_uf"});
  check(R"({"axes": {"scaler": [{"policy": "torch", "growth_interval": 0}]}})", {"growth_interval"});
  check(R"({"axes": {"foo.bar": [1]}})", {"axis 'foo.bar'", "scaler.P"});
  check(R"({"axes": {"scaler.policy": ["torch"]}})", {"scaler.policy"});
  check(R"({"axes": {"format": []}})", {"axis 'format'", "non-empty array"});
  check(R"({"axes": {"format": "fp16"}})", {"axis 'format'", "non-empty array"});
  check(R"({"axes": {"scaler": ["torch", {"label": "torch", "value": "none"}]}})",
        {"axis 'scaler'", "label 'torch'"});
  check(R"({"axes": {"trace": ["x"]}})", {"axis 'trace'", "runner"});
  check(R"({"base": {"checkpoint": "c"}, "seeds": [0]})", {"base", "'checkpoint'"});
  check(R"({"base": {"model": "mlp", "lr": -1}, "seeds": [0]})", {"base", "'lr'"});
  check(R"({"axis": {"format": ["fp16"]}})", {"unknown top-level key 'axis'", "axes"});
  check(R"({"base": {"model": "mlp"}})", {"nothing to vary"});
  check(R"({"seeds": [0, 0]})", {"seed 0", "twice"});
  check(R"({"seeds": [-1]})", {"seed", "-1"});
  check(R"({"seeds": [0], "axes": {"seed": [1]}})", {"seeds are given twice"});
  check(R"({"variants": [{"seed": 3}]})", {"variant 1", "'seed'"});
  check(R"({"variants": [{"format": "fp16"}, {"label": "format=fp16"}]})", {"variant 2", "format=fp16"});
  check(R"({"variants": [{"scaler": "torch"}], "axes": {"scaler": ["none"]}})", {"'scaler'", "both"});
  check(R"({"variants": [{"data": "imagenet"}]})", {"variant 1", "imagenet"});
  check(R"({"axes": {"data": ["synthetic:0"]}})", {"synthetic:0"});
  check(R"({"axes": {"p": [{"set": {"format": "fp16"}}], "format": ["fp32"]}})",
        {"key 'format' is set both by axis 'p'", "axis 'format'"});
  check(R"({"axes": {"p": [{"set": {}}]}})", {"axis 'p'", "non-empty object"});
  check(R"({"axes": {"p": [{"set": {"lrr": 1}}]}})", {"axis 'p'", "'lrr'"});
  check(R"({"axes": {"p": [{"set": {"seed": 1}}]}})", {"axis 'p'", "'seed'"});
}

TEST_CASE("ablate: the CLI refuses a bad ablation before anything runs", "[ablate][cli]") {
  TempDir tmp;
  write_text(tmp / "bad.json", std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["torch", "bogus"]}})");
  const auto r =
      gradscale::test::run_cli("ablate '" + (tmp / "bad.json") + "' --out '" + (tmp / "out") + "'");
  INFO(joined(r.lines));
  CHECK(r.status == 2);
  REQUIRE(r.lines.size() == 1);
  CHECK(contains(r.lines[0], "gradscale ablate: "));
  CHECK(contains(r.lines[0], "axis 'scaler'"));
  CHECK(contains(r.lines[0], "bogus"));
  CHECK_FALSE(fs::exists(tmp / "out"));

  write_text(tmp / "notjson.json", "{\"axes\": ");
  const auto n =
      gradscale::test::run_cli("ablate '" + (tmp / "notjson.json") + "' --out '" + (tmp / "out") + "'");
  CHECK(n.status == 2);
  REQUIRE(!n.lines.empty());
  CHECK(contains(n.lines[0], "not valid JSON"));
  CHECK(gradscale::test::run_cli("ablate '" + (tmp / "bad.json") + "'").status == 2);  // no --out
}

TEST_CASE("ablate: value labels and file-safe names", "[ablate]") {
  CHECK(value_label(json("torch")) == "torch");
  CHECK(value_label(json(0.001)) == "0.001");
  CHECK(value_label(json{{"policy", "static"}, {"scale", 8}}) == "static scale=8");
  CHECK(value_label(json{{"policy", "adaptive"}, {"method", "measured"}, {"n_uf", 0.01}}) ==
        "adaptive measured n_uf=0.01");
  CHECK(value_label(json{{"name", "sgd"}, {"momentum", 0.9}}) == "sgd momentum=0.9");
  CHECK(file_safe("deep-mlp:depth=16,width=256") == "deep-mlp-depth=16-width=256");
  CHECK(file_safe("adaptive measured") == "adaptive-measured");
  CHECK(file_safe("../x") == "x");
  CHECK(file_safe("///") == "run");
}

TEST_CASE("ablate: --dry-run lists the runs and runs nothing", "[ablate][cli]") {
  TempDir tmp;
  write_text(tmp / "a.json", std::string(R"({"description": "tiny", )") + kTinyBase +
                                 R"(, "axes": {"scaler": ["none", "torch"]}, "seeds": [0, 1]})");
  const auto r = gradscale::test::run_cli("ablate '" + (tmp / "a.json") + "' --dry-run");
  INFO(joined(r.lines));
  CHECK(r.status == 0);
  const std::string out = joined(r.lines);
  CHECK(contains(out, "none_seed0"));
  CHECK(contains(out, "torch_seed1"));
  CHECK(contains(out, "4 runs in 2 configurations"));
  CHECK_FALSE(fs::exists(tmp / "runs"));
}

TEST_CASE("ablate resume: a finished run is skipped, a half-written one runs again", "[ablate][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  const std::string cmd = "ablate '" + file + "' --out '" + out + "' --no-plots";
  const auto first = gradscale::test::run_cli(cmd);
  INFO(joined(first.lines));
  REQUIRE(first.status == 0);
  const RunPaths none = run_paths(out, "none_seed0"), torch = run_paths(out, "torch_seed0"),
                 stat = run_paths(out, "static-8_seed0");
  for (const RunPaths& p : {none, torch, stat}) {
    REQUIRE(run_state(p) == RunState::done);
    CHECK(fs::exists(p.trace + ".json"));
    CHECK(fs::exists(p.log));
    CHECK(fs::exists(p.status));
  }
  // torch: killed mid-run (no result, a trace cut short); static: a failure recorded by the runner.
  fs::remove(torch.result);
  fs::remove(torch.status);
  fs::remove(torch.trace + ".json");
  CHECK(run_state(torch) == RunState::half_written);
  fs::remove(stat.result);
  write_text(stat.status, R"({"exit_code": 1, "signal": null, "seconds": 0.5})");
  CHECK(run_state(stat) == RunState::failed);
  write_text(none.result + ".marker", "");  // the finished run's directory must be left alone
  const auto none_result = read_text(none.result);
  const auto none_time = fs::last_write_time(none.result);

  const auto second = gradscale::test::run_cli(cmd);
  INFO(joined(second.lines));
  REQUIRE(second.status == 0);
  const std::string log = joined(second.lines);
  CHECK(contains(log, "2 already finished, 1 to run (1 half-written, run again)"));
  CHECK(contains(log, "torch_seed0: done"));
  CHECK_FALSE(contains(log, "none_seed0: done"));
  CHECK(run_state(torch) == RunState::done);
  CHECK(fs::exists(torch.trace + ".json"));
  CHECK(read_text(none.result) == none_result);
  CHECK(fs::last_write_time(none.result) == none_time);
  CHECK(fs::exists(none.result + ".marker"));
  CHECK(run_state(stat) == RunState::failed);  // skipped, and the table says so
  CHECK(contains(read_text(out + "/table.md"), "0/1 (1 failed)"));

  const auto retry = gradscale::test::run_cli(cmd + " --retry-failed");
  INFO(joined(retry.lines));
  REQUIRE(retry.status == 0);
  CHECK(run_state(stat) == RunState::done);

  // The ablation file changed under a finished run: refused, naming the run and the key.
  const std::string base = kTinyBase;
  write_text(file, "{" + base.substr(0, base.size() - 1) +
                       R"(, "lr": 0.01}, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  const auto changed = gradscale::test::run_cli(cmd);
  CHECK(changed.status == 2);
  REQUIRE(!changed.lines.empty());
  CHECK(contains(changed.lines[0], "none_seed0"));
  CHECK(contains(changed.lines[0], "'lr'"));
}

TEST_CASE("ablate table: mean ± std over seeds, checked by hand on synthetic run files", "[ablate]") {
  TempDir tmp;
  const std::string out = tmp / "out";
  const Ablation ab = expand_ablation(
      ojson::parse(
          R"({"base": {"model": "mlp", "data": "synthetic:64"}, "axes": {"scaler": ["none", "torch"]},
                      "seeds": [0, 1, 2]})"),
      "t");
  // Header: layers 0 and 2 are parametric, layer 1 is not (it is left out of the underflow figures).
  const json header = {{"type", "header"},
                       {"layers",
                        {{{"id", 0}, {"parametric", true}},
                         {{"id", 1}, {"parametric", false}},
                         {{"id", 2}, {"parametric", true}}}}};
  auto write_run = [&](const std::string& name, double acc, double best, int skipped, double uf0, double uf2,
                       double max0, double max2, double train_seconds, int steps, double scaler_seconds) {
    const RunPaths p = run_paths(out, name);
    json history =
        json::array({{{"epoch", 1}, {"test_accuracy", best}}, {{"epoch", 2}, {"test_accuracy", acc}}});
    write_text(p.result, json{{"steps", steps},
                              {"test_accuracy", acc},
                              {"history", history},
                              {"skipped_steps", skipped},
                              {"train_seconds", train_seconds},
                              {"scaler_seconds", scaler_seconds}}
                             .dump());
    const json summary = {{"type", "summary"},
                          {"layers",
                           {{{"id", 0}, {"mean_underflow_rate", uf0}, {"max_underflow_rate", max0}},
                            {{"id", 1}, {"mean_underflow_rate", 0.9}, {"max_underflow_rate", 0.95}},
                            {{"id", 2}, {"mean_underflow_rate", uf2}, {"max_underflow_rate", max2}}}}};
    write_text(p.trace + ".jsonl",
               header.dump() + "\n" + R"({"type":"step","step":1})" + "\n" + summary.dump() + "\n");
  };
  // none: accuracies 0.5, 0.6, 0.7 → mean 0.6, std sqrt(((−0.1)² + 0 + 0.1²) / 2) = 0.1.
  write_run("none_seed0", 0.5, 0.55, 0, 0.1, 0.3, 0.3, 0.2, 2.0, 100, 0.1);
  write_run("none_seed1", 0.6, 0.65, 2, 0.2, 0.4, 0.5, 0.1, 2.0, 100, 0.2);
  write_run("none_seed2", 0.7, 0.60, 4, 0.3, 0.5, 0.1, 0.1, 4.0, 100, 0.2);
  // torch: one run finished, one diverged (counted, not averaged), one not run.
  write_run("torch_seed0", 0.8, 0.9, 1, 0.0, 0.0, 0.0, 0.0, 1.0, 50, 0.0);
  write_run("torch_seed1", 0.1, 0.1, 9, 0.5, 0.5, 0.5, 0.5, 1.0, 50, 0.0);
  {
    const RunPaths p = run_paths(out, "torch_seed1");
    json r = json::parse(read_text(p.result));
    r["diverged"] = true;
    write_text(p.result, r.dump());
  }

  const RunMetrics m = read_run_metrics(run_paths(out, "none_seed0"));
  CHECK(m.state == RunState::done);
  CHECK(m.final_accuracy == Approx(0.5));
  CHECK(m.best_accuracy == Approx(0.55));
  CHECK(m.mean_underflow == Approx(0.2));  // (0.1 + 0.3) / 2, layer 1 left out
  CHECK(m.max_underflow == Approx(0.3));
  CHECK(m.ms_per_step == Approx(20.0));    // 2 s / 100 steps
  CHECK(m.scaler_percent == Approx(5.0));  // 0.1 s / 2 s

  const Table t = build_table(ab, out);
  REQUIRE(t.rows.size() == 2);
  const TableRow& none = t.rows[0];
  CHECK(none.labels == std::vector<std::string>{"none"});
  CHECK(none.runs == 3);
  CHECK(none.done == 3);
  CHECK(none.final_accuracy.mean == Approx(0.6));
  CHECK(none.final_accuracy.std == Approx(0.1));
  CHECK(none.best_accuracy.mean == Approx((0.55 + 0.65 + 0.7) / 3));  // run 3: final 0.7 beats its history
  CHECK(none.skipped_steps.mean == Approx(2.0));
  CHECK(none.skipped_steps.std == Approx(2.0));    // sqrt((4 + 0 + 4) / 2)
  CHECK(none.mean_underflow.mean == Approx(0.3));  // runs: 0.2, 0.3, 0.4
  CHECK(none.mean_underflow.std == Approx(0.1));
  CHECK(none.max_underflow.mean == Approx((0.3 + 0.5 + 0.1) / 3));
  CHECK(none.ms_per_step.mean == Approx((20.0 + 20.0 + 40.0) / 3));
  CHECK(none.scaler_percent.mean == Approx((5.0 + 10.0 + 5.0) / 3));
  const TableRow& torch = t.rows[1];
  CHECK(torch.runs == 3);
  CHECK(torch.done == 1);
  CHECK(torch.diverged == 1);
  CHECK(torch.missing == 1);
  CHECK(torch.final_accuracy.n == 1);
  CHECK(torch.final_accuracy.mean == Approx(0.8));
  CHECK(torch.final_accuracy.std == 0.0);

  const std::string md = table_markdown(t);
  INFO(md);
  CHECK(contains(md, "| scaler | runs | final acc | best acc |"));
  CHECK(contains(md, "| none | 3 | 0.6000 ± 0.1000 |"));
  CHECK(contains(md, "| 2.0 ± 2.0 |"));
  CHECK(contains(md, "| 30 ± 10 |"));  // mean underflow in percent
  CHECK(contains(md, "| torch | 1/3 (1 diverged, 1 not run) | 0.8000 |"));
  const std::string csv = table_csv(t);
  CHECK(contains(csv, "scaler,runs,done,diverged,failed,missing,final_accuracy_mean,final_accuracy_std,"));
  CHECK(contains(csv, "\nnone,3,3,0,0,0,0.6,0.1,"));
  CHECK(contains(csv, "\ntorch,3,1,1,0,1,0.8,0,"));
  const std::string tex = table_latex(t);
  CHECK(contains(tex, "\\toprule"));
  CHECK(contains(tex, "\\midrule"));
  CHECK(contains(tex, "\\bottomrule"));
  CHECK(contains(tex, "0.6000 $\\pm$ 0.1000"));
  CHECK(contains(tex, "mean UF (\\%)"));
  const json j = table_json(t);
  CHECK(j["rows"][0]["final_accuracy"]["mean"].get<double>() == Approx(0.6));

  // mean_std on its own: sample standard deviation, NaN ignored, one value → std 0.
  const MeanStd s = mean_std({1.0, 2.0, 3.0, 4.0, std::nan("")});
  CHECK(s.n == 4);
  CHECK(s.mean == Approx(2.5));
  CHECK(s.std == Approx(std::sqrt(5.0 / 3.0)));
  CHECK(mean_std({}).n == 0);
}

TEST_CASE("ablate table on tiny synthetic runs: the table is the mean ± std of the results",
          "[ablate][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file,
             std::string("{") + kTinyBase + R"(, "axes": {"format": ["fp16"], "scaler": ["none", "static:8"]},
                                                        "seeds": [0, 1]})");
  const auto r = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --jobs 2 --no-plots");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  CHECK(contains(joined(r.lines), "| format | scaler | runs |"));  // the table is printed
  for (const char* f : {"table.md", "table.csv", "table.tex", "table.json", "ablation.json"})
    CHECK(fs::exists(out + "/" + f));

  const auto rows = read_csv(out + "/table.csv");
  REQUIRE(rows.size() == 3);
  const auto& head = rows[0];
  auto col = [&](const std::string& name) {
    const auto it = std::find(head.begin(), head.end(), name);
    REQUIRE(it != head.end());
    return static_cast<std::size_t>(it - head.begin());
  };
  const std::vector<std::string> scalers = {"none", "static-8"};
  for (std::size_t k = 0; k < scalers.size(); ++k) {
    const auto& row = rows[k + 1];
    CHECK(row[col("runs")] == "2");
    CHECK(row[col("done")] == "2");
    // By hand from the two result files: mean (a + b) / 2, sample std |a − b| / sqrt(2).
    std::vector<json> res;
    for (int seed : {0, 1}) {
      res.push_back(json::parse(
          read_text(run_paths(out, "fp16_" + scalers[k] + "_seed" + std::to_string(seed)).result)));
      CHECK(res.back()["steps"] == 3);
      CHECK(res.back()["config"]["seed"] == seed);
      CHECK(res.back()["config"]["format"] == "fp16");
    }
    const double a = res[0]["test_accuracy"], b = res[1]["test_accuracy"];
    CHECK(std::stod(row[col("final_accuracy_mean")]) == Approx((a + b) / 2).epsilon(1e-8));
    CHECK(std::stod(row[col("final_accuracy_std")]) ==
          Approx(std::fabs(a - b) / std::sqrt(2.0)).margin(1e-9));
    const double ta = res[0]["train_seconds"], tb = res[1]["train_seconds"];
    CHECK(std::stod(row[col("ms_per_step_mean")]) == Approx((ta + tb) / 2 / 3 * 1000).epsilon(1e-6));
    CHECK(!row[col("mean_underflow_mean")].empty());  // from the traces
  }
  CHECK(read_text(run_paths(out, "fp16_static-8_seed1").config).find("\"static:8\"") != std::string::npos);
}

TEST_CASE("plot_ablation.py draws a tiny table", "[ablate][plot]") {
  if (!have_matplotlib()) gradscale::test::skip_test("/usr/bin/python3 with matplotlib is not installed");
  TempDir tmp;
  write_text(tmp / "table.csv",
             "model,scaler,runs,done,diverged,failed,missing,final_accuracy_mean,final_accuracy_std,"
             "mean_underflow_mean,mean_underflow_std\n"
             "mlp,none,2,2,0,0,0,0.85,0.01,0.002,0.0005\n"
             "mlp,torch,2,2,0,0,0,0.86,0.005,0,0\n"
             "\"deep-mlp:depth=16,width=256\",none,2,0,2,0,0,,,,\n"
             "\"deep-mlp:depth=16,width=256\",torch,2,2,0,0,0,0.80,0.02,0.01,0.001\n");
  const std::string script =
      "/usr/bin/python3 '" + std::string(GRADSCALE_SOURCE_DIR) + "/scripts/plot_ablation.py'";
  const auto ok =
      gradscale::test::run_shell(script + " '" + (tmp / "table.csv") + "' --out '" + (tmp / "t.png") + "'");
  INFO(joined(ok.lines));
  REQUIRE(ok.status == 0);
  const std::string png = read_text(tmp / "t.png");
  REQUIRE(png.size() > 1000);
  CHECK(png.substr(1, 3) == "PNG");

  write_text(tmp / "bad.csv", "a,b\n1,2\n");
  const auto bad =
      gradscale::test::run_shell(script + " '" + (tmp / "bad.csv") + "' --out '" + (tmp / "b.png") + "'");
  CHECK(bad.status == 1);
  CHECK(contains(joined(bad.lines), "not a gradscale ablation table"));
  CHECK_FALSE(fs::exists(tmp / "b.png"));
}

TEST_CASE("ablate --shard: K/N parsed and checked, the shards partition the runs", "[ablate][shard]") {
  CHECK(parse_shard("2/8").index == 2);
  CHECK(parse_shard("2/8").count == 8);
  CHECK(gradscale::ablate::Shard{}.all());
  CHECK_FALSE(parse_shard("1/1").all());  // a shard, though it holds every run: no tables
  CHECK(parse_shard("1/1").holds(0));
  CHECK(parse_shard("1/1").holds(7));
  CHECK_THROWS_WITH(parse_shard("0/2"), Catch::Contains("K must be in [1, 2]"));
  CHECK_THROWS_WITH(parse_shard("3/2"), Catch::Contains("K must be in [1, 2]"));
  CHECK_THROWS_WITH(parse_shard("1/0"), Catch::Contains("N must be in [1, 100000]"));
  CHECK_THROWS_WITH(parse_shard("x/2"), Catch::Contains("expected K/N"));
  CHECK_THROWS_WITH(parse_shard("2"), Catch::Contains("expected K/N"));
  CHECK_THROWS_WITH(parse_shard("-1/2"), Catch::Contains("expected K/N"));
  for (int n : {1, 2, 3, 7}) {
    std::vector<int> owners(20, 0);
    for (int k = 1; k <= n; ++k)
      for (std::size_t i = 0; i < owners.size(); ++i) owners[i] += parse_shard(std::to_string(k) + "/" + std::to_string(n)).holds(i);
    for (int o : owners) CHECK(o == 1);  // every run in exactly one shard
  }
}

TEST_CASE("ablate --shard: two shards at once in one --out run every run once, --table-only merges",
          "[ablate][shard][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}, "seeds": [0, 1]})");
  const std::string cmd = "\"$GS\" ablate '" + file + "' --out '" + out + "' --no-plots --progress-seconds 0";
  const auto bad = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 3/2");
  CHECK(bad.status == 2);
  CHECK(contains(joined(bad.lines), "--shard '3/2': K must be in [1, 2]"));
  const auto both = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 1/2 --table-only");
  CHECK(both.status == 2);
  CHECK(contains(joined(both.lines), "--shard and --table-only together"));
  CHECK_FALSE(fs::exists(out));

  // Both shards started together, into one directory that neither has created yet.
  const auto r = gradscale::test::run_shell("(" + cmd + " --shard 1/2 > '" + (tmp / "s1.log") + "' 2>&1; echo $? > '" +
                                            (tmp / "s1.rc") + "') & (" + cmd + " --shard 2/2 > '" + (tmp / "s2.log") +
                                            "' 2>&1; echo $? > '" + (tmp / "s2.rc") + "') & wait");
  const std::string log1 = read_text(tmp / "s1.log"), log2 = read_text(tmp / "s2.log");
  INFO(log1 << "\n----\n" << log2);
  REQUIRE(r.status == 0);
  CHECK(read_text(tmp / "s1.rc") == "0\n");
  CHECK(read_text(tmp / "s2.rc") == "0\n");
  CHECK(contains(log1, "shard 1/2 (3 of 6 runs)"));
  CHECK(contains(log2, "shard 2/2 (3 of 6 runs)"));
  const Ablation ab = load_ablation(file);
  REQUIRE(ab.runs.size() == 6);
  for (std::size_t i = 0; i < ab.runs.size(); ++i) {
    const std::string done = ab.runs[i].name + ": done";
    CHECK(run_state(run_paths(out, ab.runs[i].name)) == RunState::done);
    // Run i by shard i mod 2 + 1, and by that shard only.
    CHECK(contains(i % 2 == 0 ? log1 : log2, done));
    CHECK_FALSE(contains(i % 2 == 0 ? log2 : log1, done));
  }
  CHECK_FALSE(fs::exists(out + "/table.md"));  // shards leave the tables to the merge
  const auto merged = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --no-plots --table-only");
  INFO(joined(merged.lines));
  REQUIRE(merged.status == 0);
  CHECK_FALSE(contains(joined(merged.lines), "not run"));
  CHECK(contains(read_text(out + "/table.md"), "| none | 2 |"));  // both seeds, from both shards

  // A shard's second copy at once is refused, naming the holder; so is an ablation without --shard.
  {
    const OutDirLock held(out, /*create=*/true, parse_shard("2/2"));
    const auto twice = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 2/2");
    CHECK(twice.status == 2);
    CHECK(contains(joined(twice.lines), "shard 2/2 is already running there (pid " + std::to_string(::getpid())));
    const auto whole = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --no-plots");
    CHECK(whole.status == 2);
    CHECK(contains(joined(whole.lines), "is in use by another gradscale ablate"));
    CHECK(gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 1/2").status == 0);
  }
}

TEST_CASE("ablate: a run another process holds is left to it (run locks)", "[ablate][shard][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch"]}})");
  fs::create_directories(out);
  RunLock held(out, "torch_seed0");  // as a shard of another N running it would
  REQUIRE(held.held());
  const auto r = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --no-plots --shard 1/1");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  CHECK(contains(joined(r.lines), "torch_seed0: run by another process (pid " + std::to_string(::getpid()) + "): left to it"));
  CHECK(run_state(run_paths(out, "none_seed0")) == RunState::done);
  CHECK(run_state(run_paths(out, "torch_seed0")) == RunState::pending);
  // A shard, 1/1 too, writes no tables, and its summary counts the run it left.
  CHECK_FALSE(fs::exists(out + "/table.md"));
  CHECK(contains(joined(r.lines), "ablate: shard 1/1: 2 of 2 runs (1 run now in"));
  CHECK(contains(joined(r.lines), "0 already finished, 1 left to another process; 0 diverged, 0 failed)"));
  const RunLock second(out, "torch_seed0");  // and in-process: one holder at a time
  CHECK_FALSE(second.held());
  CHECK(second.holder() == std::to_string(::getpid()));
}

TEST_CASE("scripts/slurm_ablate.sh submits a job array of shards and a merge after it", "[ablate][shard][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  // A stand-in for sbatch: records its arguments, answers job ids as `sbatch --parsable` does.
  write_text(tmp / "bin/sbatch", "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '" + (tmp / "sbatch.args") +
                                     "'\necho ---- >> '" + (tmp / "sbatch.args") + "'\necho 4242\n");
  ::chmod((tmp / "bin/sbatch").c_str(), 0755);
  const std::string script = std::string(GRADSCALE_SOURCE_DIR) + "/scripts/slurm_ablate.sh";
  const std::string env = "PATH='" + (tmp / "bin") + "':\"$PATH\" bash '" + script + "' ";
  const auto r = gradscale::test::run_shell(env + "'" + file + "' --out '" + out + "' --shards 3 --jobs 2 --gradscale \"$GS\"");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  const std::string args = read_text(tmp / "sbatch.args");
  INFO(args);
  CHECK(contains(args, "--array=1-3\n"));
  CHECK(contains(args, "--cpus-per-task=2\n"));
  CHECK(contains(args, "--shard ${SLURM_ARRAY_TASK_ID}/3 --jobs 2"));
  CHECK(contains(args, "--dependency=afterany:4242\n"));
  CHECK(contains(args, "--table-only"));
  CHECK(contains(joined(r.lines), "job array 4242"));
  // Bad input stops before anything is submitted.
  fs::remove(tmp / "sbatch.args");
  const auto bad = gradscale::test::run_shell(env + "'" + file + "' --out '" + out + "' --shards 0 --gradscale \"$GS\"");
  CHECK(bad.status == 2);
  CHECK(contains(joined(bad.lines), "--shards must be a whole number >= 1, got '0'"));
  CHECK_FALSE(fs::exists(tmp / "sbatch.args"));
}

TEST_CASE(
    "scripts/slurm_ablate.sh quotes for POSIX sh, and --dry-run prints what it submits",
    "[ablate][shard][cli]") {
  if (gradscale::test::run_shell("command -v dash >/dev/null").status != 0)
    gradscale::test::skip_test("no dash: Slurm's /bin/sh on Debian, which runs each job's --wrap here");
  TempDir tmp;
  // A directory name with a quote, a tab, a newline, non-ASCII bytes and a command substitution.
  const std::string dir = tmp / "Jos\xc3\xa9 it's\tx\ny $(touch pwned)";
  const std::string file = dir + "/a.json", out = dir + "/out";
  write_text(file, "{}");
  // Stand-ins: sbatch records its arguments (NUL-separated) and runs --wrap with dash, as Slurm runs it
  // with /bin/sh; the gradscale binary records its own.
  const std::string log = tmp / "args";
  write_text(tmp / "bin/sbatch", "#!/bin/sh\nprintf 'sbatch\\0' >> '" + log +
                                     "'; printf '%s\\0' \"$@\" >> '" + log +
                                     "'\nfor a; do case \"$a\" in --wrap=*) SLURM_ARRAY_TASK_ID=2 dash -c "
                                     "\"${a#--wrap=}\";; esac; done\necho '4242;cluster'\n");
  write_text(tmp / "bin/gs",
             "#!/bin/sh\nprintf 'gradscale\\0' >> '" + log + "'; printf '%s\\0' \"$@\" >> '" + log + "'\n");
  ::chmod((tmp / "bin/sbatch").c_str(), 0755);
  ::chmod((tmp / "bin/gs").c_str(), 0755);
  const std::string script = std::string(GRADSCALE_SOURCE_DIR) + "/scripts/slurm_ablate.sh";
  const std::string run = "cd '" + tmp.str() + "' && LC_ALL=C PATH='" + (tmp / "bin") + "':\"$PATH\" bash '" +
                          script + "' " + gradscale::test::shell_quote(file) + " --out " +
                          gradscale::test::shell_quote(out) + " --shards 3 --gradscale bin/gs ";
  const auto r = gradscale::test::run_shell(run + "-- --account=p");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  const std::string submitted = read_text(log);
  // Each job received the paths as given: the shard task, then the merge.
  const std::string task = std::string("gradscale\0ablate\0", 17) + file + '\0' + "--out" + '\0' + out +
                           '\0' + "--shard" + '\0' + "2/3" + '\0' + "--jobs" + '\0' + "1" + '\0';
  const std::string merge = std::string("gradscale\0ablate\0", 17) + file + '\0' + "--out" + '\0' + out +
                            '\0' + "--table-only" + '\0';
  CHECK(contains(submitted, task));
  CHECK(contains(submitted, merge));
  CHECK(contains(submitted, std::string("--dependency=afterany:4242") + '\0'));
  CHECK(contains(submitted, std::string("--account=p") + '\0' + "--wrap="));
  CHECK_FALSE(fs::exists(tmp / "pwned"));
  // --dry-run prints sh commands that, run, submit exactly that (the extra arguments too).
  fs::remove(log);
  const auto dry = gradscale::test::run_shell(run + "--dry-run -- --account=p > dry.sh");
  REQUIRE(dry.status == 0);
  fs::remove(log);
  const auto pasted = gradscale::test::run_shell("cd '" + tmp.str() + "' && PATH='" + (tmp / "bin") +
                                                 "':\"$PATH\" dash dry.sh");
  INFO(read_text(tmp / "dry.sh"));
  REQUIRE(pasted.status == 0);
  // The script's own check of the file ran once more in the real submission: compare from the first sbatch.
  CHECK(read_text(log) == submitted.substr(submitted.find(std::string("sbatch") + '\0')));
  CHECK_FALSE(fs::exists(tmp / "pwned"));
}

TEST_CASE("ablate stats: t quantiles against published values", "[ablate]") {
  // Two-sided 95% critical values of Student's t (any statistics table): df 1, 2, 3, 4, 30, 100.
  CHECK(t_quantile(0.975, 1) == Approx(12.706204736).margin(1e-8));
  CHECK(t_quantile(0.975, 2) == Approx(4.302652730).margin(1e-8));
  CHECK(t_quantile(0.975, 3) == Approx(3.182446305).margin(1e-8));
  CHECK(t_quantile(0.975, 4) == Approx(2.776445105).margin(1e-8));
  CHECK(t_quantile(0.975, 30) == Approx(2.042272456).margin(1e-8));
  CHECK(t_quantile(0.975, 100) == Approx(1.983971519).margin(1e-8));
  CHECK(t_quantile(0.995, 3) == Approx(5.840909310).margin(1e-8));
  CHECK(t_quantile(0.025, 4) == Approx(-2.776445105).margin(1e-8));  // symmetric
  CHECK(t_quantile(0.5, 7) == 0.0);
  CHECK(t_quantile(0.975, 100000) == Approx(1.959983).margin(1e-5));  // the normal's 1.959964 as df grows
  CHECK_THROWS(t_quantile(0.975, 0));
  CHECK_THROWS(t_quantile(1.0, 3));
}

TEST_CASE("ablate stats: the paired difference and its 95% CI, by hand", "[ablate]") {
  // Seeds 0..3 in both (4 is only in b, 5 only in a, 6 is NaN in a): d = 0.02, 0.02, −0.01, 0.04.
  const std::map<std::uint64_t, double> a = {{0, 0.80}, {1, 0.82}, {2, 0.78},
                                             {3, 0.85}, {5, 0.9},  {6, std::nan("")}};
  const std::map<std::uint64_t, double> b = {{0, 0.78}, {1, 0.80}, {2, 0.79}, {3, 0.81}, {4, 0.7}, {6, 0.5}};
  const PairedDifference d = paired_difference(a, b);
  CHECK(d.n == 4);
  CHECK(d.why.empty());
  CHECK(d.mean == Approx(0.0175));
  // Deviations 0.0025, 0.0025, −0.0275, 0.0225: sum of squares 1.275e-3, / 3 → std 0.0206155281;
  // half width t_{0.975,3} · std / √4 = 3.1824463 · 0.0103077641 = 0.0328039057.
  CHECK(d.std == Approx(0.0206155281).epsilon(1e-8));
  CHECK(d.lo == Approx(-0.0153039057).epsilon(1e-7));
  CHECK(d.hi == Approx(0.0503039057).epsilon(1e-7));
  CHECK(d.contains_zero());
  const PairedDifference one = paired_difference({{0, 0.8}, {1, 0.7}}, {{1, 0.6}, {2, 0.5}});
  CHECK(one.n == 1);
  CHECK(one.why == "1 pair");
  CHECK(std::isnan(one.lo));
  CHECK_FALSE(one.contains_zero());
  CHECK(paired_difference({}, {}).why == "0 pairs");
}

TEST_CASE("ablate stats: steps to target on constructed histories", "[ablate]") {
  const std::vector<Evaluation> h = {{100, 0.5}, {200, 0.79}, {300, 0.81}, {400, 0.7}, {500, 0.85}};
  CHECK(steps_to_target(h, 0.8) == std::optional<std::int64_t>(300));   // the first, not the last above
  CHECK(steps_to_target(h, 0.79) == std::optional<std::int64_t>(200));  // reaching is >=
  CHECK(steps_to_target(h, 0.5) == std::optional<std::int64_t>(100));
  CHECK_FALSE(steps_to_target(h, 0.9).has_value());  // never reached: no number
  CHECK_FALSE(steps_to_target(h, std::nan("")).has_value());
  CHECK_FALSE(steps_to_target({}, 0.1).has_value());
  const std::vector<Evaluation> shuffled = {{300, 0.81}, {500, 0.85}, {200, 0.79}};
  CHECK(steps_to_target(shuffled, 0.8) == std::optional<std::int64_t>(300));
}

TEST_CASE("ablate: extra_rows, target and compare_to in the file", "[ablate]") {
  const Ablation ab = expand_ablation(ojson::parse(R"({
      "base": {"model": "mlp", "data": "synthetic:64", "format": "fp16"},
      "axes": {"model": ["mlp", "cnn"], "grad_format": ["fp16", "fp8_e5m2"], "scaler": ["none", "torch"]},
      "extra_rows": [{"grad_format": "fp32", "scaler": "none"}],
      "target": {"accuracy": 0.8}, "compare_to": {"scaler": "torch"}, "seeds": [0, 1]})"),
                                      "t.json");
  // 2 models × (4 of the product + 1 fp32 row), each model's fp32 row after its product rows.
  REQUIRE(ab.groups.size() == 10);
  CHECK(ab.runs.size() == 20);
  CHECK(ab.runs[4].name == "mlp_fp32_none_seed0");
  CHECK(ab.runs[4].labels == std::vector<std::string>{"mlp", "fp32", "none"});
  CHECK(ab.runs[4].config["grad_format"] == "fp32");
  CHECK(ab.runs[9].name == "cnn_fp32_none_seed0");
  CHECK(ab.runs[10].name == "mlp_fp16_none_seed1");
  CHECK(ab.target.absolute);
  CHECK(ab.target.value == 0.8);
  CHECK(ab.compare_to == std::vector<std::pair<std::string, std::string>>{{"scaler", "torch"}});
  CHECK_FALSE(expand_ablation(ojson::parse(R"({"axes": {"scaler": ["none"]}})"), "t").target.absolute);

  const std::string ax =
      R"("base": {"model": "mlp"}, "axes": {"grad_format": ["fp16"], "scaler": ["none", "torch"]})";
  CHECK(contains(expand_error("{" + ax + R"(, "extra_rows": [{"lr": 0.1}]})"),
                 "t.json: extra_rows[1]: 'lr' names no axis of the file (axes: grad_format, scaler)"));
  CHECK(contains(expand_error("{" + ax + R"(, "extra_rows": [{"grad_format": "fp16"}]})"),
                 "is already a row of the table"));
  CHECK(contains(expand_error("{" + ax + R"(, "extra_rows": [{"grad_format": "fp99"}]})"),
                 "extra_rows[1]: axis 'grad_format'"));
  CHECK(contains(expand_error("{" + ax + R"(, "extra_rows": {}})"),
                 "\"extra_rows\" must be a non-empty array"));
  CHECK(contains(expand_error("{" + ax + R"(, "target": {"fraction": 1.5}})"),
                 "fraction must be a number in (0, 1]"));
  CHECK(contains(expand_error("{" + ax + R"(, "target": {"steps": 3}})"),
                 "\"target\" must be {\"fraction\": F}"));
  CHECK(contains(expand_error("{" + ax + R"(, "compare_to": {"model": "mlp"}})"),
                 "\"compare_to\": 'model' is not a column of the table"));
  CHECK(contains(expand_error("{" + ax + R"(, "compare_to": {"scaler": "adaptive"}})"),
                 "'scaler' must be one of its labels (none, torch)"));
}

namespace {

// A finished run's files for the table: its result (final accuracy, evaluations as `history`) and a
// trace whose summary has, when `shadow_error` is a number, the fp32 shadow's means.
void write_finished_run(const std::string& out, const std::string& name, double final_accuracy,
                        const json& history, double shadow_error = std::nan("")) {
  const RunPaths p = run_paths(out, name);
  write_text(p.result, json{{"steps", 300}, {"test_accuracy", final_accuracy}, {"history", history}}.dump());
  const json header = {{"type", "header"},
                       {"layers", {{{"id", 0}, {"parametric", true}}, {{"id", 1}, {"parametric", true}}}}};
  json layers = {{{"id", 0}, {"mean_underflow_rate", 0.0}, {"max_underflow_rate", 0.0}},
                 {{"id", 1}, {"mean_underflow_rate", 0.0}, {"max_underflow_rate", 0.0}}};
  if (std::isfinite(shadow_error)) {  // layer 0: the given error, layer 1: twice it; masses 0.01 and null
    layers[0]["shadow"] = {
        {"upstream", {{"underflow_mass", 0.01}, {"rel_error", shadow_error}, {"cosine", 1.0}}}};
    layers[1]["shadow"] = {
        {"upstream", {{"underflow_mass", nullptr}, {"rel_error", 2 * shadow_error}, {"cosine", 1.0}}}};
  }
  write_text(p.trace + ".jsonl",
             header.dump() + "\n" + json{{"type", "summary"}, {"layers", layers}}.dump() + "\n");
}

}  // namespace

TEST_CASE("ablate table: steps to target, paired differences, the headroom note, shadow means, by hand",
          "[ablate]") {
  TempDir tmp;
  const std::string out = tmp / "out";
  const Ablation ab = expand_ablation(ojson::parse(R"({
      "base": {"model": "mlp", "data": "synthetic:64", "format": "fp16"},
      "axes": {"grad_format": ["fp16"], "scaler": ["none", "torch", "static:8"]},
      "extra_rows": [{"grad_format": "fp32", "scaler": "none"}],
      "compare_to": {"scaler": "torch"}, "seeds": [0, 1, 2]})"),
                                      "t");
  // fp32: final 0.80, 0.82, 0.84 → mean 0.82, target 0.95 · 0.82 = 0.779.
  for (int s = 0; s < 3; ++s)
    write_finished_run(out, "fp32_none_seed" + std::to_string(s), 0.80 + 0.02 * s, json::array());
  // fp16 none: seed 0 reaches 0.779 at step 200 (history with the C++ trainer's cumulative "steps"),
  // seed 1 never (its final 0.75 at step 300 is below), seed 2 at step 100 (the plug-in's "step").
  write_finished_run(
      out, "fp16_none_seed0", 0.79,
      json::array({{{"steps", 100}, {"test_accuracy", 0.70}}, {{"steps", 200}, {"test_accuracy", 0.78}}}),
      0.1);
  write_finished_run(
      out, "fp16_none_seed1", 0.75,
      json::array({{{"step", 100}, {"test_accuracy", 0.60}}, {{"step", 200}, {"test_accuracy", 0.70}}}), 0.3);
  write_finished_run(out, "fp16_none_seed2", 0.80,
                     json::array({{{"step", 100}, {"steps", 100}, {"test_accuracy", 0.7795}}}), 0.2);
  // torch: final 0.81, 0.83, 0.83, reached only at the end (step 300, no history).
  for (int s = 0; s < 3; ++s)
    write_finished_run(out, "fp16_torch_seed" + std::to_string(s), s == 0 ? 0.81 : 0.83, json::array());
  write_finished_run(out, "fp16_static-8_seed0", 0.5, json::array());  // one seed only, never reached

  const Table t = build_table(ab, out);
  REQUIRE(t.rows.size() == 4);
  const TableRow &none = t.rows[0], &torch = t.rows[1], &static8 = t.rows[2], &fp32 = t.rows[3];
  CHECK(fp32.labels == std::vector<std::string>{"fp32", "none"});
  CHECK(fp32.fp32);
  CHECK_FALSE(none.fp32);
  CHECK(torch.torch);
  for (const TableRow& r : t.rows) CHECK(r.fp32_row == 3);

  CHECK(none.steps_to_target.target == Approx(0.779));
  CHECK(none.steps_to_target.runs == 3);
  CHECK(none.steps_to_target.reached == 2);
  CHECK(none.steps_to_target.steps.mean == Approx(150.0));  // (200 + 100) / 2, the run that missed left out
  CHECK(none.steps_to_target.steps.std == Approx(std::sqrt(5000.0)));
  CHECK(torch.steps_to_target.reached == 3);
  CHECK(torch.steps_to_target.steps.mean == Approx(300.0));
  CHECK(static8.steps_to_target.reached == 0);
  CHECK(static8.steps_to_target.runs == 1);
  CHECK(std::isnan(static8.steps_to_target.steps.mean));

  // Against torch, paired by seed: none − torch = −0.02, −0.08, −0.03: mean −0.0433333, std 0.0321455,
  // half width t_{0.975,2} · std / √3 = 4.3026527 · 0.0185592 = 0.0798539.
  CHECK(torch.compare.reference == 1);
  CHECK(none.compare.reference == 1);
  CHECK(none.compare.diff.n == 3);
  CHECK(none.compare.diff.mean == Approx(-0.0433333333));
  CHECK(none.compare.diff.lo == Approx(-0.1231871884).epsilon(1e-7));
  CHECK(none.compare.diff.hi == Approx(0.0365205218).epsilon(1e-7));
  CHECK(static8.compare.diff.why == "1 pair");
  CHECK(fp32.compare.reference == -1);  // no row (fp32, torch)
  // The headroom: torch − fp32 = 0.01, 0.01, −0.01 → [−0.0253510, +0.0320177] contains 0.
  CHECK(torch.headroom.reference == 3);
  CHECK(torch.headroom.diff.lo == Approx(-0.0253510182).epsilon(1e-7));
  CHECK(torch.headroom.diff.hi == Approx(0.0320176849).epsilon(1e-7));
  CHECK(none.headroom.reference == -1);

  // Shadow means: per run (e + 2e) / 2 over the layers, mass 0.01 (the null one left out).
  CHECK(none.shadow_rel_error.mean == Approx(0.3));  // runs 0.15, 0.45, 0.3
  CHECK(none.shadow_underflow_mass.mean == Approx(0.01));
  CHECK(torch.shadow_rel_error.n == 0);

  const std::string md = table_markdown(t);
  INFO(md);
  CHECK(contains(
      md,
      "| shadow rel err | shadow UF mass (%) | steps to target | Δ final acc vs scaler=torch (95% CI) |"));
  CHECK(contains(md, "| 150 ± 71 (2/3 reached) | -0.0433 [-0.1232, +0.0365] |"));
  CHECK(contains(md, "| 300 ± 0 | ref. |"));
  CHECK(contains(md, "| — (0/1 reached) | — (1 pair) |"));
  CHECK(contains(md,
                 "- steps to target of the rows whose fp32 row is fp32 / none: the first evaluated step with "
                 "test accuracy >= 0.7790 (95% of its mean final accuracy 0.8200)."));
  CHECK(
      contains(md,
               "- cannot separate the scalers: fp16 / torch against the fp32 row fp32 / none: final accuracy "
               "difference +0.0033 [-0.0254, +0.0320] over 3 seeds contains 0"));
  const std::string csv = table_csv(t);
  CHECK(
      contains(csv,
               ",target_accuracy,steps_to_target_mean,steps_to_target_std,steps_to_target_reached,"
               "steps_to_target_runs,diff_final_accuracy_mean,diff_final_accuracy_lo,diff_final_accuracy_hi,"
               "diff_final_accuracy_pairs\n"));
  CHECK(contains(csv, ",0.779,150,70.71067812,2,3,-0.04333333333,-0.1231871884,0.03652052178,3\n"));
  const json j = table_json(t);
  CHECK(j["rows"][0]["steps_to_target"]["reached"] == 2);
  CHECK(j["rows"][1]["headroom"]["reference"] == 3);
  CHECK(j["compare_to"]["scaler"] == "torch");
  CHECK(contains(table_latex(t), "150 $\\pm$ 71 (2/3 reached)"));

  // A target of the file's own: an accuracy, with no fp32 row needed.
  Ablation fixed = ab;
  fixed.target = {true, 0.7};
  const Table f = build_table(fixed, out);
  CHECK(f.rows[0].steps_to_target.reached == 3);
  CHECK(f.rows[0].steps_to_target.steps.mean == Approx((100 + 200 + 100) / 3.0));  // 0.70 >= 0.7 at step 100
  CHECK(
      contains(table_markdown(f), "- steps to target: the first evaluated step with test accuracy >= 0.7."));
}

TEST_CASE("ablate table: without an fp32 row the steps to target are empty and the table says why",
          "[ablate]") {
  TempDir tmp;
  const std::string out = tmp / "out";
  const Ablation ab = expand_ablation(
      ojson::parse(R"({"base": {"model": "mlp", "format": "fp16"}, "axes": {"scaler": ["none", "torch"]},
                       "seeds": [0, 1]})"),
      "t");
  for (const char* name : {"none_seed0", "none_seed1", "torch_seed0", "torch_seed1"})
    write_finished_run(out, name, 0.8, json::array({{{"steps", 10}, {"test_accuracy", 0.8}}}));
  const Table t = build_table(ab, out);
  for (const TableRow& r : t.rows) {
    CHECK(r.fp32_row == -1);
    CHECK(std::isnan(r.steps_to_target.target));
    CHECK(r.steps_to_target.why == "no fp32 row");
    CHECK(r.headroom.reference == -1);  // nothing to measure the torch row's headroom against
  }
  const std::string md = table_markdown(t);
  INFO(md);
  CHECK(contains(md, "| scaler | runs | final acc | best acc |"));
  CHECK_FALSE(contains(md, "shadow"));       // no run traced with the shadow: no shadow columns
  CHECK_FALSE(contains(md, "Δ final acc"));  // no "compare_to": no comparison column
  CHECK(contains(md, "| steps to target |\n"));
  CHECK(contains(md, "| — |\n"));
  CHECK(contains(
      md, "- steps to target: empty, the table has no fp32 row (gradient format fp32 and scaler none)"));
  CHECK(table_json(t)["rows"][0]["steps_to_target"]["why"] == "no fp32 row");
  CHECK(contains(table_csv(t), "\nnone,2,2,0,0,0,0.8,0,"));
}

TEST_CASE("ablate table: runs traced with the fp32 shadow give its columns", "[ablate][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase +
                       R"(, "variants": [{"label": "shadow", "shadow": true, "format": "fp16"}],
                          "axes": {"grad_format": ["fp8_e5m2"], "scaler": ["torch"]},
                          "extra_rows": [{"grad_format": "fp32", "scaler": "none"}], "seeds": [0]})");
  const auto r = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --jobs 2 --no-plots");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  const json summary =
      json::parse(read_text(run_paths(out, "shadow_fp8_e5m2_torch_seed0").trace + ".json"))["summary"];
  bool any = false;
  for (const json& l : summary["layers"]) any = any || l.contains("shadow");
  CHECK(any);  // the trace summary carries the shadow's means
  const auto rows = read_csv(out + "/table.csv");
  REQUIRE(rows.size() == 3);
  const auto& head = rows[0];
  const auto col =
      static_cast<std::size_t>(std::find(head.begin(), head.end(), "shadow_rel_error_mean") - head.begin());
  REQUIRE(col < head.size());
  CHECK(std::stod(rows[1][col]) > 0);   // e5m2 gradients differ from the fp32 ones
  CHECK(std::stod(rows[2][col]) == 0);  // the fp32 row: nothing rounded
  CHECK(contains(read_text(out + "/table.md"), "shadow rel err"));
}

TEST_CASE("ablate: the trace summary's fp32 shadow means, by hand, across a resume", "[ablate]") {
  TempDir tmp;
  const std::string base = tmp / "trace";
  const json header = {{"layers", {{{"id", 0}}, {{"id", 1}}}}};
  // Layer 1 sends a gradient upstream with the shadow's figures; layer 0 has none.
  const auto step = [](TraceWriter& w, std::int64_t at, double mass, double error, double cosine) {
    StepMonitor m;
    m.reset(2, true, 0.0);
    LayerRecord& r = m.record_of(1);
    r.ran = true;
    r.has_activation_grad = true;
    r.has_shadow_upstream = true;
    r.shadow_upstream = {mass, error, cosine};
    m.record_of(0).ran = true;
    w.write_step({at, 1, 0.5, 1.0, 1.0, false}, m);
  };
  const json totals = {{"train_loss", 0.5},    {"train_accuracy", 0.5}, {"test_loss", 0.5},
                       {"test_accuracy", 0.5}, {"wall_seconds", 1.0},   {"scaler_seconds", 0.0}};
  const auto layer_shadow = [&](int id) {
    const json doc = json::parse(read_text(base + ".json"));
    for (const json& l : doc["summary"]["layers"])
      if (l["id"] == id) return l.contains("shadow") ? l["shadow"]["upstream"] : json("no shadow");
    return json("no entry");
  };
  {
    TraceWriter w(base, header, 1, false);
    step(w, 1, 0.1, 0.2, 0.9);
    step(w, 2, 0.3, std::nan(""), 0.7);  // a null error (a norm of 0) is left out of its mean
    w.finish(totals);
  }
  json s = layer_shadow(1);
  CHECK(s["underflow_mass"].get<double>() == Approx(0.2));
  CHECK(s["rel_error"].get<double>() == Approx(0.2));
  CHECK(s["cosine"].get<double>() == Approx(0.8));
  CHECK(layer_shadow(0) == json("no entry"));  // no gradient sent upstream: no summary entry at all
  {
    TraceWriter w(base, header, 1, false, 1);  // resumed after step 1: its record counts again
    step(w, 2, 0.5, 0.4, 0.6);
    w.finish(totals);
  }
  s = layer_shadow(1);
  CHECK(s["underflow_mass"].get<double>() == Approx(0.3));
  CHECK(s["rel_error"].get<double>() == Approx(0.3));
  CHECK(s["cosine"].get<double>() == Approx(0.75));
}

TEST_CASE("ablate table: a C++ run's eval_every evaluations count for steps to target", "[ablate]") {
  TempDir tmp;
  const std::string out = tmp / "out";
  // Epoch ends at 150 and 300 (history, cumulative "steps"), evaluations every 50 steps between them.
  const RunPaths p = run_paths(out, "r");
  write_text(p.result,
             json{{"steps", 300},
                  {"test_accuracy", 0.9},
                  {"history", {{{"steps", 150}, {"test_accuracy", 0.6}}, {{"steps", 300}, {"test_accuracy", 0.9}}}},
                  {"evaluations",
                   {{{"step", 50}, {"test_accuracy", 0.3}},
                    {{"step", 100}, {"test_accuracy", 0.5}},
                    {{"step", 150}, {"test_accuracy", 0.6}},
                    {{"step", 200}, {"test_accuracy", 0.8}},
                    {{"step", 250}, {"test_accuracy", 0.85}}}}}
                 .dump());
  const RunMetrics m = read_run_metrics(p);
  REQUIRE(m.evaluations.size() == 7);
  for (std::size_t i = 1; i < m.evaluations.size(); ++i) CHECK(m.evaluations[i - 1].step <= m.evaluations[i].step);
  CHECK(steps_to_target(m.evaluations, 0.75) == std::optional<std::int64_t>(200));  // not 300, the epoch's end
  CHECK(steps_to_target(m.evaluations, 0.55) == std::optional<std::int64_t>(150));
}

TEST_CASE("ablate: a labelled empty set is a column that does not apply (bounds of a global scaler)", "[ablate]") {
  const Ablation ab = expand_ablation(ojson::parse(R"({
      "base": {"model": "mlp", "data": "synthetic:64", "format": "fp16"},
      "axes": {"scaler": [{"label": "adaptive", "value": {"policy": "adaptive", "method": "measured"}}],
               "bounds": [{"label": "derived", "set": {"scaler.bounds": "derived"}},
                          {"label": "reference", "set": {"scaler.bounds": "reference"}}]},
      "extra_rows": [{"scaler": "torch", "bounds": {"label": "-", "set": {}}}],
      "compare_to": {"scaler": "torch", "bounds": "-"}})"),
                                      "t.json");
  REQUIRE(ab.runs.size() == 3);
  CHECK(ab.runs[0].name == "adaptive_derived_seed0");
  CHECK(ab.runs[0].config["scaler"]["bounds"] == "derived");
  CHECK(ab.runs[1].config["scaler"]["bounds"] == "reference");
  CHECK(ab.runs[2].name == "torch_seed0");  // the empty value adds nothing to the name or the config
  CHECK(ab.runs[2].labels == std::vector<std::string>{"torch", "-"});
  CHECK(ab.runs[2].config["scaler"] == "torch");
  CHECK(ab.compare_to == std::vector<std::pair<std::string, std::string>>{{"scaler", "torch"}, {"bounds", "-"}});
  // Without a label an empty set is still a mistake.
  CHECK(contains(expand_error(R"({"axes": {"scaler": ["none"], "b": [{"set": {}}]}})"),
                 "\"set\" must be a non-empty object of config keys (an empty one only with a \"label\")"));
}
