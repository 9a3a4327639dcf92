// An ablation file (docs/ablations.md) and its expansion into runs: a base training config, axes whose
// values are combined as a full product, optional variants (one-axis-at-a-time overrides) and seeds.
// Every expanded config is validated here, without training, so a bad key or value stops the ablation
// before anything runs, with a message naming the axis, variant or run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

// What the expansion is built from, which the runner and the tests call too: value_label and file_safe
// (labels.h), apply_setting (settings.h), validate_config (validate.h).
#include "experiments/ablate/labels.h"
#include "experiments/ablate/settings.h"
#include "experiments/ablate/validate.h"

namespace gradscale::ablate {

// Runs an ablation may have unless its file sets "max_runs", and the most "max_runs" may allow.
inline constexpr std::uint64_t kDefaultMaxRuns = 10000;
inline constexpr std::uint64_t kLargestMaxRuns = 1000000;

// One training run of the ablation.
struct AblationRun {
  std::string name;                 // unique and file-system safe: its directory is DIR/runs/<name>
  std::vector<std::string> labels;  // the run's value in each table column (Ablation::columns)
  std::string group;                // the configuration: runs that differ only by seed share it
  std::uint64_t seed = 0;
  nlohmann::json settings;  // what the run sets over the base, {"key": value} in file order (messages)
  nlohmann::json config;    // the complete config object, dotted keys resolved; `gradscale train --config`
};

// The accuracy whose first evaluated step the table reports ("target"): a fraction of the final
// accuracy of the row's fp32 reference row (gradient format fp32, scaler none; docs/ablations.md), or
// an absolute test accuracy.
struct Target {
  bool absolute = false;
  double value = 0.95;
};

struct Ablation {
  std::string description;
  Target target;
  // "compare_to": column → the label of the reference row in that column. Each row is compared, paired
  // by seed, with the row that has its labels except these; empty: no comparison.
  std::vector<std::pair<std::string, std::string>> compare_to;
  std::vector<std::string> columns;  // "variant" (when there are variants) and the axes other than seed,
                                     // in file order
  std::vector<std::string> groups;   // configurations in table order
  std::vector<AblationRun> runs;     // in the order they run: seed outermost, so a cut ablation has
                                     // every configuration at the first seeds
};

// Expands an ablation document. `where` names it in messages (usually the file path). Throws
// ConfigError naming the top-level key, axis, axis value, variant or run that is wrong; every run's
// config is validated with validate_config.
//   {"description": "...", "base": {config keys}, "axes": {"key": [values]}, "variants": [{overrides}],
//    "seeds": [0, 1, 2], "extra_rows": [{"axis": value}], "target": {"fraction": 0.95},
//    "compare_to": {"axis": "label"}}
// Keys are those of docs/config.md, or "scaler.P" / "optimizer.P" / "schedule.P" for a parameter P
// inside that object (a name such as "torch" is first turned into {"policy": "torch"}). An axis value
// may be {"label": "...", "value": V} to name it in the table, or {"label": "...", "set": {keys}} to
// set several keys at once (the axis key is then only the column's name); a variant may have a
// "label". No two dimensions of one run may set the same key. "max_runs" bounds the number of runs
// (default kDefaultMaxRuns), checked before the runs are built; a run name longer than a file name is
// refused; a "model_spec" file path is replaced by the file's content in each run's config.
// "extra_rows" adds configurations beside the product: each entry gives some axes one value (written
// as in the axis), the other dimensions take each of theirs; its rows follow the last product row they
// share those dimensions' labels with. "target" is {"fraction": F} or {"accuracy": A} (both in (0, 1]);
// "compare_to" names, per column, the label of the reference row.
Ablation expand_ablation(const nlohmann::ordered_json& doc, const std::string& where);

// Reads and expands the ablation file at `path`.
Ablation load_ablation(const std::string& path);

}  // namespace gradscale::ablate
