// What one epoch of the training loop adds up to (Trainer::history, the result's "history") and its
// JSON form, which results print and checkpoints carry; reading it back checks each field's range.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "lib/core/json_read.h"

namespace gradscale {

// The largest iteration count and the longest time a checkpoint field may hold.
inline constexpr std::int64_t kMaxCount = std::int64_t{1} << 62;
inline constexpr double kMaxSeconds = 1e12;

struct EpochSummary {
  std::int64_t epoch = 0;  // 1-based
  double train_loss = 0, train_accuracy = 0, test_loss = 0, test_accuracy = 0;
  double seconds = 0;                         // training time of the epoch (evaluation excluded)
  std::int64_t steps = 0, skipped_steps = 0;  // cumulative at the end of the epoch
  double scale = 1;                           // S0 at the end of the epoch
};

nlohmann::json epoch_json(const EpochSummary& e);
// The fields of epoch_json, each checked (JsonFields names the field of a refusal).
EpochSummary epoch_from_json(const JsonFields& f);

}  // namespace gradscale
