// Tests of the statistics of `gradscale ablate`'s table (experiments/ablate/stats.cpp): t quantiles,
// the paired difference and its 95% CI, steps to target, by hand on constructed histories and run files.
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

TEST_CASE("ablate table: with an all-fp32 row and an fp32-gradient row, a row's fp32 row has its format",
          "[ablate]") {
  // accuracy.json's rows: both fp32 rows share as many labels with `torch` (none but the model's); the
  // one with torch's forward format (fp16) is its reference, for the target and the headroom.
  TempDir tmp;
  const std::string out = tmp / "out";
  const Ablation ab = expand_ablation(ojson::parse(R"j({
      "base": {"model": "mlp", "data": "synthetic:64", "format": "fp16"},
      "axes": {"scaler": ["torch"]},
      "extra_rows": [{"scaler": {"label": "fp32 (reference)", "set": {"format": "fp32", "scaler": "none"}}},
                     {"scaler": {"label": "fp32 gradients", "set": {"grad_format": "fp32", "scaler": "none"}}}],
      "seeds": [0, 1]})j"),
                                      "t");
  for (int s = 0; s < 2; ++s) {
    const std::string seed = "_seed" + std::to_string(s);
    write_finished_run(out, "fp32-reference" + seed, 0.90, json::array());
    write_finished_run(out, "fp32-gradients" + seed, 0.80, json::array());
    write_finished_run(out, "torch" + seed, 0.79, json::array({{{"steps", 100}, {"test_accuracy", 0.77}}}));
  }
  const Table t = build_table(ab, out);
  REQUIRE(t.rows.size() == 3);
  CHECK(t.rows[0].labels == std::vector<std::string>{"torch"});
  CHECK(t.rows[1].labels == std::vector<std::string>{"fp32 (reference)"});
  CHECK(t.rows[2].labels == std::vector<std::string>{"fp32 gradients"});
  CHECK(t.rows[0].format == "fp16");
  CHECK(t.rows[1].format == "fp32");
  CHECK(t.rows[0].fp32_row == 2);  // not ambiguous: the fp32-gradient row in fp16
  CHECK(t.rows[1].fp32_row == 1);  // each fp32 row is its own
  CHECK(t.rows[2].fp32_row == 2);
  CHECK(t.rows[0].steps_to_target.target == Approx(0.95 * 0.80));
  CHECK(t.rows[0].steps_to_target.reached == 2);
  CHECK(t.rows[0].headroom.reference == 2);
  const std::string md = table_markdown(t);
  INFO(md);
  CHECK_FALSE(contains(md, "several fp32 rows"));
  // torch − fp32 gradients = −0.01 at both seeds: std 0, the interval [−0.01, −0.01] excludes 0.
  CHECK(contains(md,
                 "- headroom of torch against the fp32 row fp32 gradients: final accuracy difference "
                 "-0.0100 [-0.0100, -0.0100] over 2 seeds excludes 0"));
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
