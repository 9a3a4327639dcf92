// Reading one JSON configuration object (an optimizer, an LR schedule, a scaler policy, a layer's
// override) with checks: every key must be known, every value of the right type and inside its range.
// Errors are ConfigError messages that name the object, the key, the allowed range and the value found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale {

// A real interval such as [0, 1) or (0, inf); `text()` writes it the way error messages show it.
struct Interval {
  double lo;
  double hi;
  bool lo_open = false;
  bool hi_open = false;
  bool contains(double x) const;
  std::string text() const;
};

class ConfigReader {
 public:
  // `cfg` must be a JSON object whose keys are all in `allowed_keys` (else ConfigError naming the
  // unknown key and listing the allowed ones). `context` prefixes every message, e.g. "optimizer 'sgd'".
  // `cfg` is borrowed and must outlive the reader.
  ConfigReader(const nlohmann::json& cfg, std::string context, std::vector<std::string> allowed_keys);

  bool has(const char* key) const;
  // A finite number inside `range`; `fallback` when the key is absent.
  double number(const char* key, double fallback, const Interval& range) const;
  // As number(), but the key must be present.
  double required_number(const char* key, const Interval& range) const;
  // An integer in [lo, hi] (a JSON float with an integral value is accepted); `fallback` when absent.
  std::int64_t integer(const char* key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const;
  std::int64_t required_integer(const char* key, std::int64_t lo, std::int64_t hi) const;
  // true or false; `fallback` when absent.
  bool boolean(const char* key, bool fallback) const;

  const std::string& context() const { return context_; }

 private:
  const nlohmann::json& at(const char* key) const;  // throws ConfigError when the key is missing
  double checked_number(const char* key, const Interval& range) const;
  std::int64_t checked_integer(const char* key, std::int64_t lo, std::int64_t hi) const;

  const nlohmann::json& cfg_;
  std::string context_;
};

// The "name" member of a configuration object: a string (else ConfigError naming `what` and listing
// `allowed`). A plain JSON string is accepted as the name alone.
std::string config_name(const nlohmann::json& cfg, const char* what, const std::vector<std::string>& allowed);

}  // namespace gradscale
