// The keys an ablation sets (see settings.h): their check, one at a time, and their application to a
// run's config.
#include "experiments/ablate/settings.h"
#include "experiments/ablate/doc_values.h"
#include "experiments/ablate/torch_runs.h"
#include "experiments/ablate/validate.h"

#include <set>

#include "lib/core/error.h"
#include "lib/model/spec.h"
#include "lib/scaler/scaler.h"
#include "lib/train/config.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;

// Keys the runner owns: each run's trace goes to its own directory, and an ablation resumes run by
// run (a half-written run is run again), not from checkpoints.
const std::set<std::string> kRunnerKeys = {"trace", "checkpoint", "save_every", "resume"};

// A data spec only PyTorch runs read: text:PATH, or an image shape after fashion-mnist / mnist:DIR /
// synthetic:N (the forms both engines read are checked as the C++ engine reads them).
bool torch_only_data(const json& value) {
  const std::string spec = value.get<std::string>();
  if (spec.compare(0, 5, "text:") == 0) return true;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string tail = spec.substr(colon + 1);
  return tail.size() >= 5 && (tail[0] == '1' || tail[0] == '3') && tail[1] == 'x';
}

}  // namespace

// Checks a key an axis or a variant sets, and (for plain keys) the value on its own.
void check_setting(const std::string& key, const json& value, const std::string& what) {
  GS_CHECK_CONFIG(!key.empty(), what << ": empty key");
  GS_CHECK_CONFIG(!kRunnerKeys.count(key), what << ": key '" << key
                                                << "' is set by the ablation runner (each run gets its own "
                                                   "trace; an ablation resumes run by run), not by the file");
  if (key.find('.') != std::string::npos) {
    json probe = json::object();
    try {
      apply_setting(probe, key, value);
    } catch (const ConfigError& e) {
      throw ConfigError(what + ": " + e.what());
    }
    return;
  }
  // A PyTorch run's model, data forms only its runs read, and its own keys: checked by torch_runs.h.
  const bool torch_data =
      key == "data" && (value.is_object() || (value.is_string() && torch_only_data(value)));
  if ((key == "model" && is_torch_model(value)) || torch_data || is_torch_only_key(key)) {
    try {
      check_torch_setting(key, value);
    } catch (const ConfigError& e) {
      throw ConfigError(what + ": " + e.what());
    }
    return;
  }
  try {
    TrainConfig c;
    c.merge_json(json{{key, value}});
    if (key == "model") builtin_model_spec(value.get<std::string>());
    if (key == "data") check_data_spec(value.get<std::string>());
  } catch (const ConfigError& e) {
    throw ConfigError(what + ": " + e.what());
  }
}

// Applies settings: plain keys first, then dotted keys, so "scaler.n_uf" refines whichever scaler the
// run ends up with.
void apply_all(json& config, const std::vector<std::pair<std::string, json>>& settings) {
  for (const auto& [k, v] : settings)
    if (k.find('.') == std::string::npos) apply_setting(config, k, v);
  for (const auto& [k, v] : settings)
    if (k.find('.') != std::string::npos) apply_setting(config, k, v);
}

void apply_setting(json& config, const std::string& key, const json& value) {
  const auto dot = key.find('.');
  if (dot == std::string::npos) {
    config[key] = value;
    return;
  }
  const std::string head = key.substr(0, dot), param = key.substr(dot + 1);
  GS_CHECK_CONFIG(
      head == "scaler" || head == "optimizer" || head == "schedule",
      "key '" << key << "': only scaler.P, optimizer.P and schedule.P may name a parameter inside a key");
  GS_CHECK_CONFIG(!param.empty() && param.find('.') == std::string::npos,
                  "key '" << key << "': expected " << head << ".PARAMETER");
  GS_CHECK_CONFIG(param != (head == "scaler" ? "policy" : "name"),
                  "key '" << key << "': set '" << head << "' itself to change the " << param);
  json obj = config.contains(head) ? config[head] : json();
  if (obj.is_null()) obj = head == "scaler" ? json("none") : json(head == "optimizer" ? "adam" : "constant");
  if (obj.is_string()) {
    obj =
        head == "scaler" ? parse_scaler_spec(obj.get<std::string>()) : json{{"name", obj.get<std::string>()}};
  }
  GS_CHECK_CONFIG(obj.is_object(),
                  "key '" << key << "': '" << head << "' is " << shown(obj) << ", not an object");
  obj[param] = value;
  config[head] = obj;
}

}  // namespace gradscale::ablate
