// What a resumed run may change (docs/config.md, "Resume"): `--resume DIR` continues the checkpoint's
// run, so the training config must be the checkpoint's except for an explicit list of keys that do
// not change what is trained. Every other key — including keys added to TrainConfig later — must be
// equal, so a different lr, schedule or scaler cannot slip into a run recorded under another config.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale {

// The top-level config keys a resumed run may change: how long it runs (epochs, max_steps), how it
// runs (threads, progress_seconds), where its outputs go (checkpoint, save_every, resume, trace,
// trace_every, trace_hist), evaluation (eval_batch) and where the data lies (data: the content is
// checked by checksum instead).
const std::vector<std::string>& resume_changeable_keys();

// Compares this run's resolved config `now` (TrainConfig::to_json()) with the checkpoint's `saved`.
// A difference outside resume_changeable_keys() throws ConfigError naming `dir`, the first differing
// key by its dotted path (e.g. "schedule.total_steps") and both values. Returns the changeable keys
// that differ, as {key: {"checkpoint": old value, "now": new value}} (an empty object when none).
nlohmann::json check_resume_config(const nlohmann::json& saved, const nlohmann::json& now,
                                   const std::string& dir);

}  // namespace gradscale
