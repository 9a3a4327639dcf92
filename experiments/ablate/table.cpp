// The ablation table (see table.h): per-run metrics, aggregation over seeds, and the four writers.
#include "experiments/ablate/table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "experiments/ablate/files.h"
#include "lib/core/json_read.h"
#include "lib/train/checkpoint.h"  // write_file_atomic

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double number_or_nan(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return kNaN;
  return j[key].get<double>();
}

// The trace's header and summary: the first and last lines of trace.jsonl, else the trace.json document.
void read_trace_ends(const std::string& base, json& header, json& summary) {
  auto parse = [](const std::string& line) {
    json j = parse_json_or_discarded(line);
    return j.is_discarded() ? json() : j;
  };
  header = parse(file_first_line(base + ".jsonl"));
  const auto lines = lines_of(file_tail(base + ".jsonl", 1 << 16));
  if (!lines.empty()) summary = parse(lines.back());
  if (summary.is_object() && summary.contains("type") && summary["type"] == "summary" && header.is_object())
    return;
  const json doc = read_json_or_null(base + ".json");
  if (!doc.is_object()) return;
  header = doc.contains("header") ? doc["header"] : json();     // a file written by a run: no value() that
  summary = doc.contains("summary") ? doc["summary"] : json();  // throws on an unexpected type
}

// One metric of a table: its name in each format and how its numbers are shown.
struct Metric {
  const char* key;     // CSV / JSON
  const char* title;   // Markdown
  const char* latex;   // LaTeX (already escaped)
  const char* format;  // printf format of one number
  MeanStd TableRow::*field;
  double RunMetrics::*source;
  bool optional = false;  // in the Markdown and LaTeX tables only when a row has a value
};

const Metric kMetrics[] = {
    {"final_accuracy", "final acc", "final acc.", "%.4f", &TableRow::final_accuracy,
     &RunMetrics::final_accuracy},
    {"best_accuracy", "best acc", "best acc.", "%.4f", &TableRow::best_accuracy, &RunMetrics::best_accuracy},
    {"skipped_steps", "skipped steps", "skipped", "%.1f", &TableRow::skipped_steps,
     &RunMetrics::skipped_steps},
    {"mean_underflow", "mean UF (%)", "mean UF (\\%)", "%.3g", &TableRow::mean_underflow,
     &RunMetrics::mean_underflow},
    {"max_underflow", "max UF (%)", "max UF (\\%)", "%.3g", &TableRow::max_underflow,
     &RunMetrics::max_underflow},
    {"ms_per_step", "ms/step", "ms/step", "%.2f", &TableRow::ms_per_step, &RunMetrics::ms_per_step},
    {"scaler_percent", "scaler (%)", "scaler (\\%)", "%.1f", &TableRow::scaler_percent,
     &RunMetrics::scaler_percent},
    {"shadow_rel_error", "shadow rel err", "shadow rel.\\ err.", "%.3g", &TableRow::shadow_rel_error,
     &RunMetrics::shadow_rel_error, true},
    {"shadow_underflow_mass", "shadow UF mass (%)", "shadow UF mass (\\%)", "%.3g",
     &TableRow::shadow_underflow_mass, &RunMetrics::shadow_underflow_mass, true},
};

// Underflow rates are fractions in the CSV and JSON, percentages where people read them.
double shown_scale(const Metric& m) {
  const std::string k = m.key;
  return k == "mean_underflow" || k == "max_underflow" || k == "shadow_underflow_mass" ? 100.0 : 1.0;
}

std::string printf_text(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// "0.8731 ± 0.0021" (with the given ± text), "0.8731" for one run, `none` for no runs.
std::string cell(const Metric& m, const MeanStd& s, const char* pm, const char* none) {
  if (s.n == 0) return none;
  const double k = shown_scale(m);
  // A count that is the same in every run reads better as an integer.
  if (std::string(m.key) == "skipped_steps" && s.std == 0 && s.mean == std::floor(s.mean))
    return printf_text("%.0f", s.mean);
  std::string text = printf_text(m.format, s.mean * k);
  if (s.n > 1) text += std::string(pm) + printf_text(m.format, s.std * k);
  return text;
}

std::string runs_cell(const TableRow& r) {
  if (r.done == r.runs) return std::to_string(r.runs);
  std::string text = std::to_string(r.done) + "/" + std::to_string(r.runs);
  std::string why;
  if (r.diverged) why += std::to_string(r.diverged) + " diverged";
  if (r.failed) why += (why.empty() ? "" : ", ") + std::to_string(r.failed) + " failed";
  if (r.missing) why += (why.empty() ? "" : ", ") + std::to_string(r.missing) + " not run";
  return text + " (" + why + ")";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (const char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_number(double v) {
  return std::isfinite(v) ? printf_text("%.10g", v) : "";
}

std::string latex_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '\\':
        out += "\\textbackslash{}";
        break;
      case '&':
      case '%':
      case '$':
      case '#':
      case '_':
      case '{':
      case '}':
        out += '\\';
        out += c;
        break;
      case '~':
        out += "\\textasciitilde{}";
        break;
      case '^':
        out += "\\textasciicircum{}";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string md_escape(const std::string& s) {
  std::string out;
  for (const char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The metrics the Markdown and LaTeX tables show: every one but an optional one no row has.
std::vector<const Metric*> shown_metrics(const Table& t) {
  std::vector<const Metric*> shown;
  for (const Metric& m : kMetrics) {
    bool any = !m.optional;
    for (const TableRow& r : t.rows) any = any || (r.*(m.field)).n > 0;
    if (any) shown.push_back(&m);
  }
  return shown;
}

// A row by its labels: "cnn / fp16 / torch".
std::string row_name(const TableRow& r) {
  std::string s;
  for (const std::string& l : r.labels) s += (s.empty() ? "" : " / ") + l;
  return s.empty() ? "base" : s;
}

// The gradient format and scaler policy a config trains with (both engines' defaults: fp32, none).
std::string grad_format_of(const json& config) {
  if (config.contains("grad_format") && config["grad_format"].is_string()) return config["grad_format"];
  if (config.contains("format") && config["format"].is_string()) return config["format"];
  return "fp32";
}

std::string scaler_policy_of(const json& config) {
  if (!config.contains("scaler") || config["scaler"].is_null()) return "none";
  const json& s = config["scaler"];
  if (s.is_string()) return s.get<std::string>().substr(0, s.get<std::string>().find(':'));
  if (s.is_object() && s.contains("policy") && s["policy"].is_string()) return s["policy"];
  return "";
}

std::string signed_text(double v) {
  return printf_text("%+.4f", v);
}

// "+0.0123 [-0.0040, +0.0290]"; "ref." for the reference itself; "—" (none) without a reference;
// "— (1 pair)" with too few pairs.
std::string compare_cell(const TableRow& r, int index, const char* none) {
  if (r.compare.reference < 0) return none;
  if (r.compare.reference == index) return "ref.";
  if (!r.compare.diff.why.empty()) return std::string(none) + " (" + r.compare.diff.why + ")";
  return signed_text(r.compare.diff.mean) + " [" + signed_text(r.compare.diff.lo) + ", " +
         signed_text(r.compare.diff.hi) + "]";
}

// "1234 ± 56", "1234 (2/3 reached)", "— (0/3 reached)"; `none` without a target or a finished run.
std::string steps_cell(const TableRow& r, const char* pm, const char* none) {
  const StepsToTarget& s = r.steps_to_target;
  if (!std::isfinite(s.target) || s.runs == 0) return none;
  std::string text = none;
  if (s.reached > 0) {
    text = printf_text("%.0f", s.steps.mean);
    if (s.reached > 1) text += std::string(pm) + printf_text("%.0f", s.steps.std);
  }
  if (s.reached < s.runs)
    text += " (" + std::to_string(s.reached) + "/" + std::to_string(s.runs) + " reached)";
  return text;
}

std::string compare_title(const Table& t) {
  std::string ref;
  for (const auto& [column, label] : t.compare_to) ref += (ref.empty() ? "" : ", ") + column + "=" + label;
  return "Δ final acc vs " + ref + " (95% CI)";
}

}  // namespace

RunMetrics read_run_metrics(const RunPaths& paths) {
  RunMetrics m;
  m.state = run_state(paths);
  if (m.state != RunState::done && m.state != RunState::diverged) return m;
  const json result = read_json_or_null(paths.result);
  m.final_accuracy = number_or_nan(result, "test_accuracy");
  m.best_accuracy = m.final_accuracy;
  if (result.contains("history") && result["history"].is_array())
    for (const json& h : result["history"]) {
      const double a = number_or_nan(h, "test_accuracy");
      if (std::isfinite(a) && !(a <= m.best_accuracy)) m.best_accuracy = a;
    }
  m.skipped_steps = number_or_nan(result, "skipped_steps");
  const double steps = number_or_nan(result, "steps");
  // A C++ run's evaluations are its epochs' ends (history) and, with eval_every, its "evaluations";
  // a PyTorch run's are its history.
  for (const char* list : {"history", "evaluations"})
    if (result.contains(list) && result[list].is_array())
      for (const json& h : result[list]) {
        const double at =
            std::isfinite(number_or_nan(h, "step")) ? number_or_nan(h, "step") : number_or_nan(h, "steps");
        const double a = number_or_nan(h, "test_accuracy");
        if (std::isfinite(at) && std::isfinite(a)) m.evaluations.push_back({static_cast<std::int64_t>(at), a});
      }
  std::stable_sort(m.evaluations.begin(), m.evaluations.end(),
                   [](const Evaluation& a, const Evaluation& b) { return a.step < b.step; });
  if (std::isfinite(steps) && std::isfinite(m.final_accuracy) &&
      (m.evaluations.empty() || m.evaluations.back().step < static_cast<std::int64_t>(steps)))
    m.evaluations.push_back({static_cast<std::int64_t>(steps), m.final_accuracy});
  double train_seconds = number_or_nan(result, "train_seconds");
  if (!std::isfinite(train_seconds) && result.contains("epoch_seconds") &&
      result["epoch_seconds"].is_array()) {
    train_seconds = 0;  // results written before train_seconds existed: whole epochs only
    for (const json& s : result["epoch_seconds"])
      if (s.is_number()) train_seconds += s.get<double>();
  }
  if (std::isfinite(train_seconds) && train_seconds > 0) {
    if (steps > 0) m.ms_per_step = 1000.0 * train_seconds / steps;
    m.scaler_percent = 100.0 * number_or_nan(result, "scaler_seconds") / train_seconds;
  }

  json header, summary;
  read_trace_ends(paths.trace, header, summary);
  if (summary.is_object() && summary.contains("layers") && summary["layers"].is_array()) {
    std::set<long long> parametric;
    bool have_table = false;
    if (header.is_object() && header.contains("layers") && header["layers"].is_array())
      for (const json& l : header["layers"])
        if (l.is_object() && l.contains("id")) {
          have_table = true;
          if (l.contains("parametric") && l["parametric"] == true && l["id"].is_number_integer())
            parametric.insert(l["id"].get<long long>());
        }
    double sum = 0, max = 0, error_sum = 0, mass_sum = 0;
    int n = 0, n_error = 0, n_mass = 0;
    for (const json& l : summary["layers"]) {
      if (!l.is_object() || !l.contains("id") || !l["id"].is_number_integer() ||
          (have_table && !parametric.count(l["id"].get<long long>())))
        continue;
      if (l.contains("shadow") && l["shadow"].is_object() && l["shadow"].contains("upstream")) {
        const double e = number_or_nan(l["shadow"]["upstream"], "rel_error"),
                     u = number_or_nan(l["shadow"]["upstream"], "underflow_mass");
        if (std::isfinite(e)) error_sum += e, ++n_error;
        if (std::isfinite(u)) mass_sum += u, ++n_mass;
      }
      const double mean = number_or_nan(l, "mean_underflow_rate"),
                   mx = number_or_nan(l, "max_underflow_rate");
      if (!std::isfinite(mean) || !std::isfinite(mx)) continue;
      sum += mean;
      max = std::max(max, mx);
      ++n;
    }
    if (n > 0) {
      m.mean_underflow = sum / n;
      m.max_underflow = max;
    }
    if (n_error > 0) m.shadow_rel_error = error_sum / n_error;
    if (n_mass > 0) m.shadow_underflow_mass = mass_sum / n_mass;
  }
  return m;
}

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
  // The fp32 reference row of each row: of the fp32 rows, the one that shares the most labels with it.
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
        shared += r.labels[c] == t.rows[f].labels[c];
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
  }
}

std::string table_markdown(const Table& t) {
  const std::vector<const Metric*> metrics = shown_metrics(t);
  const bool compare = !t.compare_to.empty();
  std::ostringstream os;
  os << "|";
  for (const std::string& c : t.columns) os << " " << md_escape(c) << " |";
  os << " runs |";
  for (const Metric* m : metrics) os << " " << m->title << " |";
  os << " steps to target |";
  if (compare) os << " " << md_escape(compare_title(t)) << " |";
  os << "\n|";
  for (std::size_t i = 0; i < t.columns.size(); ++i) os << "---|";
  os << "---|";
  for (std::size_t i = 0; i < metrics.size() + 1 + (compare ? 1 : 0); ++i) os << "---:|";
  os << "\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const TableRow& r = t.rows[i];
    os << "|";
    for (const std::string& l : r.labels) os << " " << md_escape(l) << " |";
    os << " " << runs_cell(r) << " |";
    for (const Metric* m : metrics) os << " " << cell(*m, r.*(m->field), " ± ", "—") << " |";
    os << " " << steps_cell(r, " ± ", "—") << " |";
    if (compare) os << " " << compare_cell(r, static_cast<int>(i), "—") << " |";
    os << "\n";
  }
  if (!t.notes.empty()) os << "\n";
  for (const std::string& n : t.notes) os << "- " << n << "\n";
  return os.str();
}

std::string table_csv(const Table& t) {
  std::ostringstream os;
  for (const std::string& c : t.columns) os << csv_field(c) << ",";
  os << "runs,done,diverged,failed,missing";
  for (const Metric& m : kMetrics) os << "," << m.key << "_mean," << m.key << "_std";
  os << ",target_accuracy,steps_to_target_mean,steps_to_target_std,steps_to_target_reached,"
        "steps_to_target_runs,diff_final_accuracy_mean,diff_final_accuracy_lo,diff_final_accuracy_hi,"
        "diff_final_accuracy_pairs";
  os << "\n";
  for (const TableRow& r : t.rows) {
    for (const std::string& l : r.labels) os << csv_field(l) << ",";
    os << r.runs << "," << r.done << "," << r.diverged << "," << r.failed << "," << r.missing;
    for (const Metric& m : kMetrics) {
      const MeanStd& s = r.*(m.field);
      os << "," << csv_number(s.mean) << "," << csv_number(s.n > 0 ? s.std : kNaN);
    }
    const StepsToTarget& st = r.steps_to_target;
    os << "," << csv_number(st.target) << "," << csv_number(st.steps.mean) << ","
       << csv_number(st.steps.n > 0 ? st.steps.std : kNaN) << "," << st.reached << "," << st.runs;
    const PairedDifference& d = r.compare.diff;
    os << "," << csv_number(d.mean) << "," << csv_number(d.lo) << "," << csv_number(d.hi) << ","
       << (r.compare.reference >= 0 ? std::to_string(d.n) : "");
    os << "\n";
  }
  return os.str();
}

std::string table_latex(const Table& t) {
  const std::vector<const Metric*> metrics = shown_metrics(t);
  const bool compare = !t.compare_to.empty();
  std::ostringstream os;
  os << "% gradscale ablate: mean $\\pm$ sample std over seeds; needs \\usepackage{booktabs}\n";
  os << "\\begin{tabular}{" << std::string(t.columns.size(), 'l') << "r"
     << std::string(metrics.size() + 1 + (compare ? 1 : 0), 'r') << "}\n\\toprule\n";
  for (const std::string& c : t.columns) os << latex_escape(c) << " & ";
  os << "runs";
  for (const Metric* m : metrics) os << " & " << m->latex;
  os << " & steps to target";
  if (compare) os << " & " << latex_escape(compare_title(t));
  os << " \\\\\n\\midrule\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const TableRow& r = t.rows[i];
    // A little space where the first column changes groups the rows, as booktabs suggests.
    if (i > 0 && t.columns.size() > 1 && r.labels[0] != t.rows[i - 1].labels[0]) os << "\\addlinespace\n";
    for (const std::string& l : r.labels) os << latex_escape(l) << " & ";
    os << latex_escape(runs_cell(r));
    for (const Metric* m : metrics) os << " & " << cell(*m, r.*(m->field), " $\\pm$ ", "--");
    os << " & " << steps_cell(r, " $\\pm$ ", "--");  // digits and "(2/3 reached)": nothing to escape
    if (compare) os << " & " << latex_escape(compare_cell(r, static_cast<int>(i), "--"));
    os << " \\\\\n";
  }
  os << "\\bottomrule\n\\end{tabular}\n";
  for (const std::string& n : t.notes) os << "\\par\\smallskip{\\footnotesize " << latex_escape(n) << "}\n";
  return os.str();
}

json table_json(const Table& t) {
  const auto number = [](double v) { return std::isfinite(v) ? json(v) : json(); };
  const auto comparison = [&](const Comparison& c) {
    if (c.reference < 0) return json();
    return json{{"reference", c.reference},
                {"pairs", c.diff.n},
                {"mean", number(c.diff.mean)},
                {"std", number(c.diff.std)},
                {"lo", number(c.diff.lo)},
                {"hi", number(c.diff.hi)},
                {"why", c.diff.why.empty() ? json() : json(c.diff.why)}};
  };
  json rows = json::array();
  for (const TableRow& r : t.rows) {
    json row = {{"labels", r.labels},     {"runs", r.runs},     {"done", r.done},
                {"diverged", r.diverged}, {"failed", r.failed}, {"missing", r.missing}};
    for (const Metric& m : kMetrics) {
      const MeanStd& s = r.*(m.field);
      row[m.key] = {{"mean", std::isfinite(s.mean) ? json(s.mean) : json()},
                    {"std", s.n > 0 && std::isfinite(s.std) ? json(s.std) : json()},
                    {"n", s.n}};
    }
    const StepsToTarget& st = r.steps_to_target;
    row["fp32"] = r.fp32;
    row["fp32_row"] = r.fp32_row >= 0 ? json(r.fp32_row) : json();
    row["steps_to_target"] = {{"target", number(st.target)},
                              {"mean", number(st.steps.mean)},
                              {"std", st.steps.n > 0 ? number(st.steps.std) : json()},
                              {"reached", st.reached},
                              {"runs", st.runs},
                              {"why", st.why.empty() ? json() : json(st.why)}};
    row["compare"] = comparison(r.compare);
    row["headroom"] = comparison(r.headroom);
    rows.push_back(std::move(row));
  }
  json compare_to = json::object();
  for (const auto& [column, label] : t.compare_to) compare_to[column] = label;
  return {{"schema", "gradscale.ablation-table/1"},
          {"description", t.description},
          {"columns", t.columns},
          {"target", {{t.target.absolute ? "accuracy" : "fraction", t.target.value}}},
          {"compare_to", compare_to},
          {"rows", rows},
          {"notes", t.notes}};
}

void write_tables(const Table& t, const std::string& out_dir) {
  const std::filesystem::path d(out_dir);
  write_file_atomic((d / "table.md").string(), table_markdown(t));
  write_file_atomic((d / "table.csv").string(), table_csv(t));
  write_file_atomic((d / "table.tex").string(), table_latex(t));
  write_file_atomic((d / "table.json").string(), table_json(t).dump(2) + "\n");
}

}  // namespace gradscale::ablate
