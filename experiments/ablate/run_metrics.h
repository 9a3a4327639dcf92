// One run's figures for the ablation table (table.h): read from the files the run left in
// DIR/runs/<name>, its result.json and the header and summary of its trace, tolerating a run that was
// cut while writing them.
#pragma once

#include <limits>
#include <vector>

#include "experiments/ablate/runner.h"
#include "experiments/ablate/stats.h"

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
  // With the fp32 shadow, over the same layers: the mean of the layers' mean upstream relative error
  // and underflowed mass (the trace summary's "shadow"; docs/trace.md).
  double shadow_rel_error = std::numeric_limits<double>::quiet_NaN();
  double shadow_underflow_mass = std::numeric_limits<double>::quiet_NaN();
  // Every test evaluation: the result's history (at its "step", else its cumulative "steps") and the
  // final one (at "steps") when the history does not end there.
  std::vector<Evaluation> evaluations;
};

// Reads DIR/runs/<name>: result.json and the summary (and header) of trace.jsonl / trace.json.
RunMetrics read_run_metrics(const RunPaths& paths);

}  // namespace gradscale::ablate
