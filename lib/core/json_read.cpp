// Bounded JSON parsing, excerpts for messages and checked member reads (see json_read.h).
#include "lib/core/json_read.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/file_read.h"

namespace gradscale {
namespace {

using json = nlohmann::json;

[[noreturn]] void raise(JsonSource source, const std::string& message) {
  if (source == JsonSource::config) throw ConfigError(message);
  throw DataError(message);
}

// Whether arrays and objects in `text` nest deeper than kMaxJsonDepth. Strings are skipped, so
// brackets inside them do not count; in text that is not JSON the count may be off, but then the
// parser refuses the text anyway.
bool too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

constexpr int kExcerptDepth = 3;

void append_excerpt(const json& v, std::string& out, std::size_t max_chars, int depth) {
  if (out.size() > max_chars) return;
  const bool object = v.is_object();
  if (object || v.is_array()) {
    if (v.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    if (depth >= kExcerptDepth) {
      out += object ? "{...}" : "[...]";
      return;
    }
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= max_chars; ++it) {
      if (!first) out += ',';
      first = false;
      if (object) {
        out += json(text_excerpt(it.key(), max_chars)).dump(-1, ' ', false, json::error_handler_t::replace);
        out += ':';
      }
      append_excerpt(*it, out, max_chars, depth + 1);
    }
    out += object ? '}' : ']';
    return;
  }
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    out += json(s.size() > max_chars ? s.substr(0, max_chars) : s)
               .dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  out += v.dump();  // numbers, booleans, null: short
}

}  // namespace

void check_json_depth(std::string_view text, const std::string& what, JsonSource source) {
  if (too_deep(text))
    raise(source, what + " is JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

json parse_json(std::string_view text, const std::string& what, JsonSource source) {
  check_json_depth(text, what, source);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
    raise(source, what + " is not valid JSON: " + text_excerpt(e.what(), 2 * kExcerptChars));
  }
}

json parse_json_or_discarded(std::string_view text) {
  if (too_deep(text)) return json::value_t::discarded;
  return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

json read_json_file(const std::string& path, const std::string& what, JsonSource source) {
  const BoundedRead r = read_bounded(path, kMaxJsonFileBytes);
  if (r.problem == ReadProblem::too_large)
    raise(source, read_problem_message(r, what, path, kMaxJsonFileBytes) + ": not a gradscale JSON file");
  if (r.problem != ReadProblem::none) raise(source, read_problem_message(r, what, path, kMaxJsonFileBytes));
  return parse_json(r.text, what + " '" + path + "'", source);
}

std::string json_excerpt(const json& value, std::size_t max_chars) {
  std::string out;
  append_excerpt(value, out, max_chars, 0);
  return text_excerpt(out, max_chars);
}

std::string text_excerpt(std::string_view text, std::size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return std::string(text.substr(0, max_chars)) + "...";
}

json json_real(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;  // NaN is written as null
}

JsonFields::JsonFields(const json& object, std::string file, std::string path)
    : object_(object), file_(std::move(file)), path_(std::move(path)) {
  if (!object_.is_object()) {
    if (path_.empty()) throw DataError(file_ + ": expected a JSON object, got " + object_.type_name());
    throw DataError(file_ + ": field '" + path_ + "' must be an object, got " + json_excerpt(object_));
  }
}

std::string JsonFields::path(const char* key) const {
  return path_.empty() ? std::string(key) : path_ + "." + key;
}

void JsonFields::fail(const char* key, const std::string& problem) const {
  throw DataError(file_ + ": field '" + path(key) + "' " + problem);
}

const json& JsonFields::any(const char* key) const {
  const auto it = object_.find(key);
  if (it == object_.end()) fail(key, "is missing");
  return *it;
}

const json& JsonFields::object(const char* key) const {
  const json& v = any(key);
  if (!v.is_object()) fail(key, "must be an object, got " + json_excerpt(v));
  return v;
}

const json& JsonFields::array(const char* key) const {
  const json& v = any(key);
  if (!v.is_array()) fail(key, "must be an array, got " + json_excerpt(v));
  return v;
}

std::string JsonFields::text(const char* key) const {
  const json& v = any(key);
  if (!v.is_string()) fail(key, "must be a string, got " + json_excerpt(v));
  return v.get<std::string>();
}

bool JsonFields::boolean(const char* key) const {
  const json& v = any(key);
  if (!v.is_boolean()) fail(key, "must be true or false, got " + json_excerpt(v));
  return v.get<bool>();
}

std::int64_t JsonFields::integer(const char* key, std::int64_t lo, std::int64_t hi) const {
  const json& v = any(key);
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  const bool fits =
      v.is_number_integer() &&
      !(v.is_number_unsigned() &&
        v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
  if (!fits || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    fail(key, "must be " + range + ", got " + json_excerpt(v));
  return v.get<std::int64_t>();
}

double JsonFields::number(const char* key, double lo, double hi) const {
  const json& v = any(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi) {
    std::ostringstream range;
    range << "must be a finite number in [" << lo << ", " << hi << "], got " << json_excerpt(v);
    fail(key, range.str());
  }
  return v.get<double>();
}

double JsonFields::real(const char* key) const {
  const json& v = any(key);
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (v == "inf") return std::numeric_limits<double>::infinity();
  if (v == "-inf") return -std::numeric_limits<double>::infinity();
  fail(key, "must be a number, \"inf\", \"-inf\" or null, got " + json_excerpt(v));
}

JsonFields JsonFields::fields(const char* key) const {
  return JsonFields(object(key), file_, path(key));
}

}  // namespace gradscale
