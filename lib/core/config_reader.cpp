// Checked reading of JSON configuration objects (see config_reader.h).
#include "lib/core/config_reader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

std::string bound_text(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

bool Interval::contains(double x) const {
  const bool above = lo_open ? x > lo : x >= lo;
  const bool below = hi_open ? x < hi : x <= hi;
  return above && below;
}

std::string Interval::text() const {
  return std::string(lo_open ? "(" : "[") + bound_text(lo) + ", " + bound_text(hi) + (hi_open ? ")" : "]");
}

ConfigReader::ConfigReader(const nlohmann::json& cfg, std::string context,
                           std::vector<std::string> allowed_keys)
    : cfg_(cfg), context_(std::move(context)) {
  GS_CHECK_CONFIG(cfg_.is_object(), context_ << ": expected a JSON object, got " << json_excerpt(cfg_));
  for (const auto& item : cfg_.items()) {
    const bool known = std::find(allowed_keys.begin(), allowed_keys.end(), item.key()) != allowed_keys.end();
    GS_CHECK_CONFIG(known, context_ << ": unknown key '" << text_excerpt(item.key())
                                    << "' (allowed: " << join(allowed_keys) << ")");
  }
}

bool ConfigReader::has(const char* key) const {
  return cfg_.contains(key);
}

const nlohmann::json& ConfigReader::at(const char* key) const {
  GS_CHECK_CONFIG(cfg_.contains(key), context_ << ": missing key '" << key << "'");
  return cfg_.at(key);
}

double ConfigReader::checked_number(const char* key, const Interval& range) const {
  const nlohmann::json& v = at(key);
  GS_CHECK_CONFIG(v.is_number(), context_ << ": '" << key << "' must be a number in " << range.text()
                                          << ", got " << json_excerpt(v));
  const double x = v.get<double>();
  GS_CHECK_CONFIG(std::isfinite(x) && range.contains(x),
                  context_ << ": '" << key << "' must be in " << range.text() << ", got " << json_excerpt(v));
  return x;
}

double ConfigReader::number(const char* key, double fallback, const Interval& range) const {
  return has(key) ? checked_number(key, range) : fallback;
}

double ConfigReader::required_number(const char* key, const Interval& range) const {
  return checked_number(key, range);
}

std::int64_t ConfigReader::checked_integer(const char* key, std::int64_t lo, std::int64_t hi) const {
  const nlohmann::json& v = at(key);
  std::ostringstream range;
  range << "an integer in [" << lo << ", " << hi << "]";
  GS_CHECK_CONFIG(v.is_number(),
                  context_ << ": '" << key << "' must be " << range.str() << ", got " << json_excerpt(v));
  std::int64_t n = 0;
  if (v.is_number_integer()) {
    // Unsigned values beyond int64 are rejected by the range check below after saturating.
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    n = v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(kMax)
            ? kMax
            : v.get<std::int64_t>();
    GS_CHECK_CONFIG(n >= lo && n <= hi,
                    context_ << ": '" << key << "' must be " << range.str() << ", got " << json_excerpt(v));
  } else {
    const double x = v.get<double>();
    const bool integral = std::isfinite(x) && std::floor(x) == x;
    const bool inside = integral && x >= static_cast<double>(lo) && x <= static_cast<double>(hi);
    GS_CHECK_CONFIG(inside,
                    context_ << ": '" << key << "' must be " << range.str() << ", got " << json_excerpt(v));
    n = static_cast<std::int64_t>(x);
  }
  return n;
}

std::int64_t ConfigReader::integer(const char* key, std::int64_t fallback, std::int64_t lo,
                                   std::int64_t hi) const {
  return has(key) ? checked_integer(key, lo, hi) : fallback;
}

std::int64_t ConfigReader::required_integer(const char* key, std::int64_t lo, std::int64_t hi) const {
  return checked_integer(key, lo, hi);
}

bool ConfigReader::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = cfg_.at(key);
  GS_CHECK_CONFIG(v.is_boolean(),
                  context_ << ": '" << key << "' must be true or false, got " << json_excerpt(v));
  return v.get<bool>();
}

std::string config_name(const nlohmann::json& cfg, const char* what,
                        const std::vector<std::string>& allowed) {
  const nlohmann::json* name = &cfg;
  if (cfg.is_object()) {
    GS_CHECK_CONFIG(cfg.contains("name"), what << ": missing key 'name' (one of " << join(allowed) << ")");
    name = &cfg.at("name");
  }
  GS_CHECK_CONFIG(name->is_string(), what << ": 'name' must be a string, one of " << join(allowed) << "; got "
                                          << json_excerpt(*name));
  const std::string s = name->get<std::string>();
  GS_CHECK_CONFIG(std::find(allowed.begin(), allowed.end(), s) != allowed.end(),
                  what << ": unknown name '" << text_excerpt(s) << "' (allowed: " << join(allowed) << ")");
  return s;
}

}  // namespace gradscale
