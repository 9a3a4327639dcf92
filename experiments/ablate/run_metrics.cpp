// One run's figures (see run_metrics.h): its result's accuracies, skipped steps, evaluations and
// times, and its trace summary's underflow and fp32-shadow means over the parametric layers.
#include "experiments/ablate/run_metrics.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "experiments/ablate/files.h"
#include "lib/core/json_read.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;

double number_or_nan(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number())
    return std::numeric_limits<double>::quiet_NaN();
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
        if (std::isfinite(at) && std::isfinite(a))
          m.evaluations.push_back({static_cast<std::int64_t>(at), a});
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

}  // namespace gradscale::ablate
