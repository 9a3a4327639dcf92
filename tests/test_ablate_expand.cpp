// Tests of `gradscale ablate`'s ablation files (experiments/ablate/ablation.cpp): expansion into runs
// (product of axes, variants, seeds, scaler.* keys, extra_rows, labelled empty sets), value labels, and
// the errors that name the bad key or value before anything runs (--dry-run runs nothing).
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
#include "tests/ablate_fixtures.h"
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
using namespace gradscale::test::ablate_fixtures;

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

TEST_CASE("ablate: every ablation file the project ships expands and validates", "[ablate]") {
  // What `gradscale ablate FILE --dry-run` checks before anything runs, for each file under
  // experiments/ablations/: a file that no longer expands (a renamed key, a model or scaler the
  // library refuses) fails here, not hours into an evidence run.
  // Their paths (a PyTorch model's file) are relative to the repository's root, where they run.
  struct InDirectory {
    fs::path before;
    explicit InDirectory(const fs::path& dir) : before(fs::current_path()) { fs::current_path(dir); }
    ~InDirectory() {
      std::error_code ec;
      fs::current_path(before, ec);
    }
  } at_root(GRADSCALE_SOURCE_DIR);
  const fs::path dir = fs::path(GRADSCALE_SOURCE_DIR) / "experiments" / "ablations";
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 10);
  for (const fs::path& file : files) {
    INFO(file.filename().string());
    Ablation a;
    REQUIRE_NOTHROW(a = load_ablation(file.string()));
    CHECK_FALSE(a.description.empty());
    CHECK_FALSE(a.runs.empty());
    std::set<std::string> names;
    for (const AblationRun& r : a.runs) names.insert(r.name);
    CHECK(names.size() == a.runs.size());
  }
}
