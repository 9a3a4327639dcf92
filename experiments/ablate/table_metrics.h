// The ablation table's metrics (table.h), one entry per figure with its name in each format, and the
// text that both the table's notes (table.cpp) and its writers (table_writers.cpp) print.
#pragma once

#include <string>

#include "experiments/ablate/table.h"

namespace gradscale::ablate {

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

inline const Metric kMetrics[] = {
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

// `v` printed with a printf format of one number (at most 63 characters).
std::string printf_text(const char* format, double v);

// A difference with its sign, "+0.0123".
std::string signed_text(double v);

// A row by its labels: "cnn / fp16 / torch" ("base" without labels).
std::string row_name(const TableRow& r);

// The title of the comparison column: "Δ final acc vs scaler=torch (95% CI)".
std::string compare_title(const Table& t);

}  // namespace gradscale::ablate
