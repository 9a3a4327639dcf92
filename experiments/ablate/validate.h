// The check of one training config without training: what `gradscale train --config` would refuse
// is refused when the ablation is expanded, before anything runs (see ablation.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace gradscale::ablate {

// Checks one training config as `gradscale train --config` would read it, without loading data or
// training: TrainConfig::merge_json, the scaler (make_scaler), the model, optimizer, schedule and the
// form of the data spec. A PyTorch run's config (torch_runs.h) is checked by validate_torch_config.
// Throws ConfigError with the library's message.
void validate_config(const nlohmann::json& config);

// Checks the form of a C++ run's data spec: fashion-mnist, mnist:DIR (an existing directory), synthetic
// or synthetic:N (N in [1, 10000000]). Throws ConfigError naming the key 'data' and the allowed forms.
void check_data_spec(const std::string& spec);

}  // namespace gradscale::ablate
