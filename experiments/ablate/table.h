// The ablation table: per configuration (runs that differ only by seed), mean ± sample standard
// deviation over the seeds of each run's metrics, read from the runs' result files and trace
// summaries, the steps to a target accuracy, and the difference to a reference row paired by seed;
// written as Markdown, CSV (mean and std in their own columns, for plots), LaTeX (booktabs) and JSON.
// Runs that diverged or failed are counted, not averaged in.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/run_metrics.h"  // RunMetrics, read_run_metrics
#include "experiments/ablate/runner.h"
#include "experiments/ablate/stats.h"

namespace gradscale::ablate {

// Mean and sample standard deviation (n − 1; 0 for one value) of the finite values; n counts them.
struct MeanStd {
  double mean = std::numeric_limits<double>::quiet_NaN();
  double std = std::numeric_limits<double>::quiet_NaN();
  int n = 0;
};
MeanStd mean_std(const std::vector<double>& values);

// The first evaluated step at which each finished run reaches the row's target accuracy.
struct StepsToTarget {
  double target = std::numeric_limits<double>::quiet_NaN();  // NaN: the row has no target (why says)
  MeanStd steps;                                             // over the finished runs that reached it
  int reached = 0, runs = 0;                                 // of the finished runs
  std::string why;
};

// This row's final accuracy minus a reference row's, paired by seed (stats.h).
struct Comparison {
  int reference = -1;  // the reference row's index in Table::rows; -1: none
  PairedDifference diff;
};

struct TableRow {
  std::vector<std::string> labels;  // one per Table::columns
  int runs = 0, done = 0, diverged = 0, failed = 0, missing = 0;
  MeanStd final_accuracy, best_accuracy, skipped_steps, mean_underflow, max_underflow, ms_per_step,
      scaler_percent, shadow_rel_error, shadow_underflow_mass;
  bool fp32 = false;   // gradient format fp32 and scaler none: a reference for targets and headroom
  std::string format;  // the forward format its runs train with (the engines' default: fp32)
  bool torch = false;  // the scaler is the global "torch" policy
  int fp32_row = -1;   // the row's fp32 reference row (index in Table::rows); -1: none
  StepsToTarget steps_to_target;
  Comparison compare;   // with the row "compare_to" names (when the ablation has one)
  Comparison headroom;  // a torch row with its fp32 row: can the table separate the scalers?
};

struct Table {
  std::string description;
  std::vector<std::string> columns;
  std::vector<TableRow> rows;
  Target target;
  std::vector<std::pair<std::string, std::string>> compare_to;
  std::vector<std::string> notes;  // shown under the table: targets, what cannot be compared and why
};

// Fills the rows' fp32 reference rows, steps to target, comparisons and the notes from the rows and
// their finished runs' figures (`runs[i]`: row i's runs, by seed). build_table calls it.
void compare_rows(Table& t, const std::vector<std::map<std::uint64_t, RunMetrics>>& runs);

// Aggregates the runs found under out_dir (runs not finished count as missing).
Table build_table(const Ablation& ablation, const std::string& out_dir);

// The table as text (table_writers.cpp).
std::string table_markdown(const Table& t);
std::string table_csv(const Table& t);
std::string table_latex(const Table& t);
nlohmann::json table_json(const Table& t);

// Writes DIR/table.md, table.csv, table.tex and table.json (atomically).
void write_tables(const Table& t, const std::string& out_dir);

}  // namespace gradscale::ablate
