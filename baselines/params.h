// Checked reading of a scaler's JSON configuration and saved state, shared by every policy in
// baselines/. It builds on the project's one configuration reader (lib/optim/config_reader.h: unknown
// keys, types and ranges, with messages naming the key and the allowed range) and adds what loss
// scales need: values held in float32 the way the peer holds them, `null` for an absent optional
// bound, and exact float32 values when a saved state is restored (so a resumed run is bit-identical).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/config_reader.h"

namespace gradscale::baselines {


constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

inline Interval above(double lo) {
  return {lo, kInf, true, true};
}  // (lo, inf)
inline Interval at_least(double lo) {
  return {lo, kInf, false, true};
}  // [lo, inf)
inline Interval open_interval(double lo, double hi) {
  return {lo, hi, true, true};
}
inline Interval closed_interval(double lo, double hi) {
  return {lo, hi, false, false};
}

// A reader for the configuration object of `policy`: the allowed keys are "policy" plus `parameters`.
ConfigReader config_reader(const nlohmann::json& config, const std::string& policy,
                           std::vector<std::string> parameters);
// A reader for a saved state of `policy`: exactly the keys in `counters`, every one required.
ConfigReader state_reader(const nlohmann::json& state, const std::string& policy,
                          std::vector<std::string> counters);

// A configuration number the peer keeps in float32: read as a double in `range`, rounded to float32
// once (as assigning a Python float to a float32 tensor does); the rounded value must be finite and in
// `range` as well (1e39 is a valid JSON number, not a float32 one).
float number_f32(const ConfigReader& reader, const char* key, float fallback, const Interval& range);
// An optional bound: absent or null gives nullopt, else a finite number in `range`.
std::optional<double> optional_number(const ConfigReader& reader, const nlohmann::json& config,
                                      const char* key, const Interval& range);

// A float32 counter of a saved state: present, in `range`, and exactly a float32 value (what state()
// wrote); anything else cannot have come from this policy and would not resume bit-identically.
float state_f32(const ConfigReader& reader, const char* key, const Interval& range);

// `x` as JSON writes it (shortest text that reads back to the same double; inf and nan by name), for
// error messages.
std::string number_text(double x);

}  // namespace gradscale::baselines
