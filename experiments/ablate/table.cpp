// The ablation table (see table.h): the runs' figures aggregated over seeds per configuration, and the
// rows compared (fp32 reference rows, steps to target, paired differences, the notes). The runs'
// figures are read by run_metrics.cpp, the table written by table_writers.cpp.
#include "experiments/ablate/table.h"
#include "experiments/ablate/table_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;

// The forward format, gradient format and scaler policy a config trains with (both engines' defaults:
// fp32, the forward format, none).
std::string format_of(const json& config) {
  if (config.contains("format") && config["format"].is_string()) return config["format"];
  return "fp32";
}

std::string grad_format_of(const json& config) {
  if (config.contains("grad_format") && config["grad_format"].is_string()) return config["grad_format"];
  return format_of(config);
}

std::string scaler_policy_of(const json& config) {
  if (!config.contains("scaler") || config["scaler"].is_null()) return "none";
  const json& s = config["scaler"];
  if (s.is_string()) return s.get<std::string>().substr(0, s.get<std::string>().find(':'));
  if (s.is_object() && s.contains("policy") && s["policy"].is_string()) return s["policy"];
  return "";
}

}  // namespace

MeanStd mean_std(const std::vector<double>& values) {
  MeanStd s;
  double sum = 0;
  for (const double v : values)
    if (std::isfinite(v)) {
      sum += v;
      ++s.n;
    }
  if (s.n == 0) return s;
  s.mean = sum / s.n;
  double ss = 0;
  for (const double v : values)
    if (std::isfinite(v)) ss += (v - s.mean) * (v - s.mean);
  s.std = s.n > 1 ? std::sqrt(ss / (s.n - 1)) : 0.0;
  return s;
}

Table build_table(const Ablation& ablation, const std::string& out_dir) {
  Table t;
  t.description = ablation.description;
  t.columns = ablation.columns;
  t.target = ablation.target;
  t.compare_to = ablation.compare_to;
  std::map<std::string, std::vector<RunMetrics>> by_group;
  std::map<std::string, std::map<std::uint64_t, RunMetrics>> done_by_seed;
  std::map<std::string, const AblationRun*> first;
  for (const AblationRun& r : ablation.runs) {
    RunMetrics m = read_run_metrics(run_paths(out_dir, r.name));
    if (m.state == RunState::done) done_by_seed[r.group][r.seed] = m;
    by_group[r.group].push_back(std::move(m));
    if (!first.count(r.group)) first[r.group] = &r;
  }
  std::vector<std::map<std::uint64_t, RunMetrics>> runs;
  for (const std::string& g : ablation.groups) {
    TableRow row;
    if (first.count(g)) {
      const AblationRun& r = *first[g];
      row.labels = r.labels;
      row.fp32 = grad_format_of(r.config) == "fp32" && scaler_policy_of(r.config) == "none";
      row.format = format_of(r.config);
      row.torch = scaler_policy_of(r.config) == "torch";
    }
    runs.push_back(done_by_seed[g]);
    std::vector<std::vector<double>> values(std::size(kMetrics));
    for (const RunMetrics& m : by_group[g]) {
      ++row.runs;
      switch (m.state) {
        case RunState::done:
          ++row.done;
          break;
        case RunState::diverged:
          ++row.diverged;
          break;
        case RunState::failed:
          ++row.failed;
          break;
        default:
          ++row.missing;
          break;
      }
      if (m.state != RunState::done) continue;  // diverged and failed runs are counted, not averaged
      for (std::size_t i = 0; i < std::size(kMetrics); ++i) values[i].push_back(m.*(kMetrics[i].source));
    }
    for (std::size_t i = 0; i < std::size(kMetrics); ++i) row.*(kMetrics[i].field) = mean_std(values[i]);
    t.rows.push_back(std::move(row));
  }
  compare_rows(t, runs);
  return t;
}

void compare_rows(Table& t, const std::vector<std::map<std::uint64_t, RunMetrics>>& runs) {
  const int n_rows = static_cast<int>(t.rows.size());
  const auto accuracies = [&](int i) {
    std::map<std::uint64_t, double> a;
    for (const auto& [seed, m] : runs[i]) a[seed] = m.final_accuracy;
    return a;
  };
  // The fp32 reference row of each row: of the fp32 rows, the one that shares the most labels with it;
  // between two that share as many, the one with the row's forward format (a table with both an
  // all-fp32 row and an fp32-gradient row in fp16 gives an fp16 row the latter: its headroom).
  std::vector<int> fp32_rows;
  for (int i = 0; i < n_rows; ++i)
    if (t.rows[i].fp32) fp32_rows.push_back(i);
  std::set<std::string> ambiguous;
  for (int i = 0; i < n_rows; ++i) {
    TableRow& r = t.rows[i];
    int best = -1, best_shared = -1, ties = 0;
    for (const int f : fp32_rows) {
      int shared = 0;
      for (std::size_t c = 0; c < r.labels.size() && c < t.rows[f].labels.size(); ++c)
        shared += 2 * (r.labels[c] == t.rows[f].labels[c]);
      shared += r.format == t.rows[f].format;  // counts less than one label
      if (shared > best_shared)
        best = f, best_shared = shared, ties = 0;
      else if (shared == best_shared)
        ++ties;
    }
    if (ties == 0)
      r.fp32_row = best;
    else
      ambiguous.insert(row_name(r));
  }

  // Steps to target.
  std::map<int, double> targets;  // fp32 row → the target it gives
  for (int i = 0; i < n_rows; ++i) {
    TableRow& r = t.rows[i];
    StepsToTarget& s = r.steps_to_target;
    if (t.target.absolute) {
      s.target = t.target.value;
    } else if (r.fp32_row < 0) {
      s.why = fp32_rows.empty() ? "no fp32 row" : "no single fp32 row";
    } else if (t.rows[r.fp32_row].final_accuracy.n == 0) {
      s.why = "the fp32 row has no finished run";
    } else {
      s.target = t.target.value * t.rows[r.fp32_row].final_accuracy.mean;
      targets[r.fp32_row] = s.target;
    }
    std::vector<double> steps;
    for (const auto& [seed, m] : runs[i]) {
      (void)seed;
      ++s.runs;
      const auto at = steps_to_target(m.evaluations, s.target);
      if (!at) continue;
      ++s.reached;
      steps.push_back(static_cast<double>(*at));
    }
    s.steps = mean_std(steps);
  }

  // Paired by seed: with the row "compare_to" names, and a torch row with its fp32 row.
  for (int i = 0; i < n_rows && !t.compare_to.empty(); ++i) {
    TableRow& r = t.rows[i];
    std::vector<std::string> want = r.labels;
    for (const auto& [column, label] : t.compare_to) {
      const auto c = std::find(t.columns.begin(), t.columns.end(), column);
      if (c != t.columns.end() && static_cast<std::size_t>(c - t.columns.begin()) < want.size())
        want[static_cast<std::size_t>(c - t.columns.begin())] = label;
    }
    for (int j = 0; j < n_rows; ++j)
      if (t.rows[j].labels == want) r.compare.reference = j;
    if (r.compare.reference >= 0 && r.compare.reference != i)
      r.compare.diff = paired_difference(accuracies(i), accuracies(r.compare.reference));
  }
  for (int i = 0; i < n_rows; ++i) {
    TableRow& r = t.rows[i];
    if (!r.torch || r.fp32_row < 0) continue;
    r.headroom.reference = r.fp32_row;
    r.headroom.diff = paired_difference(accuracies(i), accuracies(r.fp32_row));
  }

  // The notes under the table.
  if (t.target.absolute) {
    t.notes.push_back("steps to target: the first evaluated step with test accuracy >= " +
                      printf_text("%.4g", t.target.value) + ".");
  } else if (fp32_rows.empty()) {
    t.notes.push_back(
        "steps to target: empty, the table has no fp32 row (gradient format fp32 and scaler none) whose "
        "final "
        "accuracy would set the target; docs/ablations.md says how to add one, or give \"target\": "
        "{\"accuracy\": A}.");
  } else {
    for (const auto& [f, target] : targets)
      t.notes.push_back("steps to target of the rows whose fp32 row is " + row_name(t.rows[f]) +
                        ": the first evaluated step with test accuracy >= " + printf_text("%.4f", target) +
                        " (" + printf_text("%g", 100 * t.target.value) + "% of its mean final accuracy " +
                        printf_text("%.4f", t.rows[f].final_accuracy.mean) + ").");
    for (const std::string& a : ambiguous)
      t.notes.push_back("steps to target of " + a +
                        ": empty, several fp32 rows share as many labels with it (no single reference).");
  }
  if (!t.compare_to.empty())
    t.notes.push_back(
        compare_title(t) +
        ": the mean difference of the final accuracy to the row with those labels and the row's "
        "other labels, paired by seed, with its 95% confidence interval (t distribution over the "
        "pairs; none with fewer than 2).");
  for (int i = 0; i < n_rows; ++i) {
    const TableRow& r = t.rows[i];
    if (r.headroom.reference < 0) continue;
    const PairedDifference& d = r.headroom.diff;
    const std::string what = row_name(r) + " against the fp32 row " + row_name(t.rows[r.headroom.reference]);
    if (!d.why.empty())
      t.notes.push_back("headroom of " + what + ": unknown (" + d.why + " of seeds with both finished).");
    else if (d.contains_zero())
      t.notes.push_back("cannot separate the scalers: " + what + ": final accuracy difference " +
                        signed_text(d.mean) + " [" + signed_text(d.lo) + ", " + signed_text(d.hi) +
                        "] over " + std::to_string(d.n) +
                        " seeds contains 0: the global torch scaler cannot be told apart from fp32 "
                        "gradients here, so no scaler can be shown to do better.");
    else
      t.notes.push_back("headroom of " + what + ": final accuracy difference " + signed_text(d.mean) + " [" +
                        signed_text(d.lo) + ", " + signed_text(d.hi) + "] over " + std::to_string(d.n) +
                        " seeds excludes 0: the global torch scaler and fp32 gradients differ here, so "
                        "this workload can separate the scalers.");
  }
}

}  // namespace gradscale::ablate
