// Tests of the table `gradscale ablate` writes (experiments/ablate/table.cpp): the mean ± std over
// seeds, checked by hand on synthetic run files and on tiny real runs; the fp32 shadow's columns and
// the trace summary they come from; eval_every's evaluations; plot_ablation.py on a tiny table.
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
