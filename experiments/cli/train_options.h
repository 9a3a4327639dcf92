// The options of a training run (docs/config.md), shared by `gradscale train` and `gradscale bench
// step`: one description, and one mapping from parsed options (over an optional --config file) to a
// TrainConfig.
#pragma once

#include <string>
#include <vector>

#include "experiments/cli/parse.h"
#include "lib/core/command_files.h"
#include "lib/core/output_path.h"
#include "lib/train/config.h"

namespace gradscale::cli {

// Adds --config and every TrainConfig key as an option to `desc`.
void add_train_options(po::options_description& desc);

// The config: the --config file's keys (if given), then the options present in `vm` over them.
// Bad values → ConfigError naming the option or key.
TrainConfig train_config_from(const po::variables_map& vm);

// The files given with --config and --model-spec, and a model_spec file the config names: an output
// path must not be one of them.
std::vector<InputFile> input_files(const po::variables_map& vm);

// Refuses a --trace that names a directory ("dir/", "dir/.", "..") instead of a path prefix.
void check_trace_path(const std::string& trace);

// Every file a `gradscale train` run reads and writes (inputs, --resume and --checkpoint directories,
// --result, the two trace files), for CommandFiles::check before anything runs.
CommandFiles train_files(const po::variables_map& vm, const TrainConfig& config, const std::string& result);

}  // namespace gradscale::cli
