// PyTorch runs in an ablation (docs/ablations.md, "PyTorch models"): a run whose "model" is
// {"torchvision": NAME, ...} or {"python": "file.py:function", ...} is trained by `python -m gradscale.run`
// (python/gradscale/run.py) through the plug-in, in its own process as `gradscale train` runs are, and
// writes the same result and trace files. Here: the keys' static checks (at expansion), the interpreter,
// the child's command line, and the check-time build of every distinct model and data (no training).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"

namespace gradscale::ablate {

// Whether a model value is a PyTorch model: an object with "torchvision" or "python".
bool is_torch_model(const nlohmann::json& model);
// Whether a run's config is a PyTorch run (its "model" is one).
bool is_torch_run(const nlohmann::json& config);

// Keys only PyTorch runs read (eval_examples: their evaluations on the first N test examples).
bool is_torch_only_key(const std::string& key);

// Checks one setting of a PyTorch run on its own, without Python: "model" (an object naming a
// torchvision model or an existing factory file), "data" (fashion-mnist[:CxHxW], mnist:DIR, synthetic[:N],
// text:PATH[:ctx=N] of an existing file, or {"python": "file.py:function", ...}) and
// eval_examples. Throws ConfigError naming the key.
void check_torch_setting(const std::string& key, const nlohmann::json& value);

// Checks a PyTorch run's whole config as far as C++ can: the keys above, and every other key as
// `gradscale train` reads it (format, scaler, optimizer, schedule, ...). Throws ConfigError.
void validate_torch_config(const nlohmann::json& config);

// The interpreter PyTorch runs use when --python is not given: $GRADSCALE_PYTHON, else the checkout's
// .venv/bin/python when there is one, else python3 from PATH. An absolute path ("" when none is found).
std::string default_python();

// Makes the checkout's python/ directory (the one holding gradscale/run.py) importable by the children:
// prepended to $PYTHONPATH of this process, which they inherit. Nothing when there is none (an installed
// package is found by the interpreter itself).
void export_python_path();

// The command line of a PyTorch run: python -m gradscale.run CONFIG --result R --trace T [--threads N].
std::vector<std::string> torch_run_argv(const std::string& python, const std::string& config,
                                        const std::string& result, const std::string& trace, int threads);

// Builds every distinct (model, data) of the ablation's PyTorch runs once in `python` (python -m
// gradscale.run --check-runs): a missing torchvision, an unknown model, a factory that raises or returns
// no nn.Module, an output that does not fit the data. Throws ConfigError with one line per bad run, each
// naming the run and the key; nothing when the ablation has no PyTorch runs. The check succeeds only when
// the program says `ok: checked N runs` (a --python that is some other program exits 0 having checked
// nothing: ConfigError). `scratch_dir`: where the list of runs is written for the check (removed after).
void check_torch_runs(const Ablation& ablation, const std::string& python, const std::string& scratch_dir);

}  // namespace gradscale::ablate
