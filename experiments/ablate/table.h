// The ablation table: per configuration (runs that differ only by seed), mean ± sample standard
// deviation over the seeds of each run's metrics, read from the runs' result files and trace
// summaries; written as Markdown, CSV (mean and std in their own columns, for plots), LaTeX (booktabs)
// and JSON. Runs that diverged or failed are counted, not averaged in.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/runner.h"

namespace gradscale::ablate {

// One run's figures; NaN where the run has none (no trace, not finished).
struct RunMetrics {
  RunState state = RunState::pending;
  double final_accuracy = std::numeric_limits<double>::quiet_NaN();  // test accuracy at the end
  double best_accuracy = std::numeric_limits<double>::quiet_NaN();  // best per-epoch test accuracy (or final)
  double skipped_steps = std::numeric_limits<double>::quiet_NaN();
  // Over the parametric layers in the trace summary (those that send an activation gradient upstream):
  double mean_underflow = std::numeric_limits<double>::quiet_NaN();  // mean of the layers' mean rates
  double max_underflow = std::numeric_limits<double>::quiet_NaN();   // largest of the layers' max rates
  double ms_per_step = std::numeric_limits<double>::quiet_NaN();     // training seconds / steps, in ms
  double scaler_percent =
      std::numeric_limits<double>::quiet_NaN();  // 100 · scaler_seconds / training seconds
};

// Reads DIR/runs/<name>: result.json and the summary (and header) of trace.jsonl / trace.json.
RunMetrics read_run_metrics(const RunPaths& paths);

// Mean and sample standard deviation (n − 1; 0 for one value) of the finite values; n counts them.
struct MeanStd {
  double mean = std::numeric_limits<double>::quiet_NaN();
  double std = std::numeric_limits<double>::quiet_NaN();
  int n = 0;
};
MeanStd mean_std(const std::vector<double>& values);

struct TableRow {
  std::vector<std::string> labels;  // one per Table::columns
  int runs = 0, done = 0, diverged = 0, failed = 0, missing = 0;
  MeanStd final_accuracy, best_accuracy, skipped_steps, mean_underflow, max_underflow, ms_per_step,
      scaler_percent;
};

struct Table {
  std::string description;
  std::vector<std::string> columns;
  std::vector<TableRow> rows;
};

// Aggregates the runs found under out_dir (runs not finished count as missing).
Table build_table(const Ablation& ablation, const std::string& out_dir);

std::string table_markdown(const Table& t);
std::string table_csv(const Table& t);
std::string table_latex(const Table& t);
nlohmann::json table_json(const Table& t);

// Writes DIR/table.md, table.csv, table.tex and table.json (atomically).
void write_tables(const Table& t, const std::string& out_dir);

}  // namespace gradscale::ablate
