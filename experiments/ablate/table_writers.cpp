// The ablation table's four writers (declared in table.h): Markdown and LaTeX for people (the metrics
// some row has, mean ± std in one cell, rates in percent), CSV and JSON for programs (every metric,
// mean and std apart, rates as fractions, empty or null where there is no value).
#include "experiments/ablate/table.h"
#include "experiments/ablate/table_metrics.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "lib/train/checkpoint.h"  // write_file_atomic

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Underflow rates are fractions in the CSV and JSON, percentages where people read them.
double shown_scale(const Metric& m) {
  const std::string k = m.key;
  return k == "mean_underflow" || k == "max_underflow" || k == "shadow_underflow_mass" ? 100.0 : 1.0;
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

}  // namespace

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
