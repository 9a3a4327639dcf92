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
  header = doc.contains("header") ? doc["header"] : json();  // a file written by a run: no value() that
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
};

// Underflow rates are fractions in the CSV and JSON, percentages where people read them.
double shown_scale(const Metric& m) {
  const std::string k = m.key;
  return k == "mean_underflow" || k == "max_underflow" ? 100.0 : 1.0;
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
    double sum = 0, max = 0;
    int n = 0;
    for (const json& l : summary["layers"]) {
      if (!l.is_object() || !l.contains("id") || !l["id"].is_number_integer() ||
          (have_table && !parametric.count(l["id"].get<long long>())))
        continue;
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
  std::map<std::string, std::vector<RunMetrics>> by_group;
  std::map<std::string, std::vector<std::string>> labels;
  for (const AblationRun& r : ablation.runs) {
    by_group[r.group].push_back(read_run_metrics(run_paths(out_dir, r.name)));
    labels[r.group] = r.labels;
  }
  for (const std::string& g : ablation.groups) {
    TableRow row;
    row.labels = labels[g];
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
  return t;
}

std::string table_markdown(const Table& t) {
  std::ostringstream os;
  os << "|";
  for (const std::string& c : t.columns) os << " " << md_escape(c) << " |";
  os << " runs |";
  for (const Metric& m : kMetrics) os << " " << m.title << " |";
  os << "\n|";
  for (std::size_t i = 0; i < t.columns.size(); ++i) os << "---|";
  os << "---|";
  for (std::size_t i = 0; i < std::size(kMetrics); ++i) os << "---:|";
  os << "\n";
  for (const TableRow& r : t.rows) {
    os << "|";
    for (const std::string& l : r.labels) os << " " << md_escape(l) << " |";
    os << " " << runs_cell(r) << " |";
    for (const Metric& m : kMetrics) os << " " << cell(m, r.*(m.field), " ± ", "—") << " |";
    os << "\n";
  }
  return os.str();
}

std::string table_csv(const Table& t) {
  std::ostringstream os;
  for (const std::string& c : t.columns) os << csv_field(c) << ",";
  os << "runs,done,diverged,failed,missing";
  for (const Metric& m : kMetrics) os << "," << m.key << "_mean," << m.key << "_std";
  os << "\n";
  for (const TableRow& r : t.rows) {
    for (const std::string& l : r.labels) os << csv_field(l) << ",";
    os << r.runs << "," << r.done << "," << r.diverged << "," << r.failed << "," << r.missing;
    for (const Metric& m : kMetrics) {
      const MeanStd& s = r.*(m.field);
      os << "," << csv_number(s.mean) << "," << csv_number(s.n > 0 ? s.std : kNaN);
    }
    os << "\n";
  }
  return os.str();
}

std::string table_latex(const Table& t) {
  std::ostringstream os;
  os << "% gradscale ablate: mean $\\pm$ sample std over seeds; needs \\usepackage{booktabs}\n";
  os << "\\begin{tabular}{" << std::string(t.columns.size(), 'l') << "r"
     << std::string(std::size(kMetrics), 'r') << "}\n\\toprule\n";
  for (const std::string& c : t.columns) os << latex_escape(c) << " & ";
  os << "runs";
  for (const Metric& m : kMetrics) os << " & " << m.latex;
  os << " \\\\\n\\midrule\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const TableRow& r = t.rows[i];
    // A little space where the first column changes groups the rows, as booktabs suggests.
    if (i > 0 && t.columns.size() > 1 && r.labels[0] != t.rows[i - 1].labels[0]) os << "\\addlinespace\n";
    for (const std::string& l : r.labels) os << latex_escape(l) << " & ";
    os << latex_escape(runs_cell(r));
    for (const Metric& m : kMetrics) os << " & " << cell(m, r.*(m.field), " $\\pm$ ", "--");
    os << " \\\\\n";
  }
  os << "\\bottomrule\n\\end{tabular}\n";
  return os.str();
}

json table_json(const Table& t) {
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
    rows.push_back(std::move(row));
  }
  return {{"schema", "gradscale.ablation-table/1"},
          {"description", t.description},
          {"columns", t.columns},
          {"rows", rows}};
}

void write_tables(const Table& t, const std::string& out_dir) {
  const std::filesystem::path d(out_dir);
  write_file_atomic((d / "table.md").string(), table_markdown(t));
  write_file_atomic((d / "table.csv").string(), table_csv(t));
  write_file_atomic((d / "table.tex").string(), table_latex(t));
  write_file_atomic((d / "table.json").string(), table_json(t).dump(2) + "\n");
}

}  // namespace gradscale::ablate
