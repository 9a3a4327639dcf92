// The keys an ablation's base, axes and variants set (docs/ablations.md): each checked on its own when
// the file is read, before any run is built, and applied over the base to make a run's config.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale::ablate {

// Applies `key` = `value` to a config object: a plain key replaces the entry; "scaler.P" (and
// "optimizer.P", "schedule.P") sets P inside that object, turning a name or "static:S" into an
// object first. Throws ConfigError for any other dotted key.
void apply_setting(nlohmann::json& config, const std::string& key, const nlohmann::json& value);

// Applies settings: plain keys first, then dotted keys, so "scaler.n_uf" refines whichever scaler the
// run ends up with.
void apply_all(nlohmann::json& config, const std::vector<std::pair<std::string, nlohmann::json>>& settings);

// Checks a key an axis or a variant sets, and (for plain keys) the value on its own: not a key the
// runner owns (trace, checkpoint, save_every, resume), a dotted key apply_setting takes, a value
// TrainConfig reads (a PyTorch run's model, data and keys: check_torch_setting, torch_runs.h). Throws
// ConfigError starting with `what`.
void check_setting(const std::string& key, const nlohmann::json& value, const std::string& what);

}  // namespace gradscale::ablate
