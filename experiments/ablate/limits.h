// The bounds of an ablation's expansion, checked before its runs are built: how many runs ("max_runs"),
// how long a run name may be (it is a directory name), and the model spec read by content.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale::ablate {

// The longest run name: it is a directory name (runs/<name>), and file systems allow 255 bytes.
inline constexpr std::size_t kMaxRunNameBytes = 255;

// Refuses (ConfigError) an ablation of more runs than its "max_runs" (default kDefaultMaxRuns) allows:
// `dims` are the columns and their number of choices, `seeds` the number of seeds. The product is
// computed saturating, so it never wraps around.
void check_run_count(const nlohmann::ordered_json& doc,
                     const std::vector<std::pair<std::string, std::size_t>>& dims, std::size_t seeds,
                     const std::string& where);

// Refuses (ConfigError) a run name that cannot be a directory name (too long).
void check_run_name(const std::string& name, const std::string& where);

// Replaces a "model_spec" that is a file path by the file's content (read once per path into
// `files`), so that a run's config identifies the model by content: a spec file edited between two
// invocations makes the finished runs differ from the ablation instead of counting as done.
void inline_model_spec(nlohmann::json& config, std::map<std::string, nlohmann::json>& files);

}  // namespace gradscale::ablate
