// Bounds of an ablation's expansion (see limits.h).
#include "experiments/ablate/limits.h"

#include <cstdint>

#include "experiments/ablate/ablation.h"
#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale::ablate {

void check_run_count(const nlohmann::ordered_json& doc,
                     const std::vector<std::pair<std::string, std::size_t>>& dims, std::size_t seeds,
                     const std::string& where) {
  std::uint64_t limit = kDefaultMaxRuns;
  if (doc.contains("max_runs")) {
    const auto& v = doc["max_runs"];
    GS_CHECK_CONFIG(v.is_number_unsigned() && v.get<std::uint64_t>() >= 1 &&
                        v.get<std::uint64_t>() <= kLargestMaxRuns,
                    where << ": \"max_runs\" must be an integer in [1, " << kLargestMaxRuns << "], got "
                          << text_excerpt(v.dump(), 40));
    limit = v.get<std::uint64_t>();
  }
  std::uint64_t runs = seeds;
  std::string shape = std::to_string(seeds) + " seed" + (seeds == 1 ? "" : "s");
  for (const auto& [column, n] : dims) {
    runs = n == 0 || runs <= limit / n ? runs * n : limit + 1;  // saturates: never wraps
    shape += " x " + std::to_string(n) + " (" + text_excerpt(column, 40) + ")";
  }
  GS_CHECK_CONFIG(runs <= limit, where << ": " << shape << " make more than " << limit
                                       << " runs (\"max_runs\"): split the ablation, or raise \"max_runs\"");
}

void check_run_name(const std::string& name, const std::string& where) {
  GS_CHECK_CONFIG(name.size() <= kMaxRunNameBytes,
                  where << ": run name '" << text_excerpt(name, 60) << "' is " << name.size()
                        << " bytes long, longer than a file name may be (" << kMaxRunNameBytes
                        << "): give the axis values shorter labels ({\"label\": ..., \"value\": ...})");
}

void inline_model_spec(nlohmann::json& config, std::map<std::string, nlohmann::json>& files) {
  if (!config.contains("model_spec") || !config["model_spec"].is_string()) return;
  const std::string path = config["model_spec"].get<std::string>();
  auto it = files.find(path);
  if (it == files.end())
    it = files.emplace(path, read_json_file(path, "config key 'model_spec'", JsonSource::config)).first;
  config["model_spec"] = it->second;
}

}  // namespace gradscale::ablate
