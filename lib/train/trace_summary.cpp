// The check of a trace summary (see trace_summary.h).
#include "lib/train/trace_summary.h"

#include <cmath>

#include "lib/core/error.h"

namespace gradscale {
namespace {

using nlohmann::json;

// `v` as a message shows it: its JSON text, cut to 40 characters.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

[[noreturn]] void wrong_type(const char* key, const char* expected, const json& v) {
  throw DataError("key '" + std::string(key) + "' must be " + expected + ", got " + v.type_name() + " " +
                  shown(v));
}

const json& need(const json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw DataError("missing key '" + std::string(key) + "'");
  return *it;
}

// A parsed file holds non-negative integers as unsigned; a summary built in memory (TraceWriter::finish)
// may hold them as signed: both are accepted, a negative one is not.
std::uint64_t need_uint(const json& obj, const char* key) {
  const json& v = need(obj, key);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    wrong_type(key, "a non-negative integer", v);
  return v.get<std::uint64_t>();
}

double need_number(const json& obj, const char* key) {
  const json& v = need(obj, key);
  if (!v.is_number() || !std::isfinite(v.get<double>())) wrong_type(key, "a finite number", v);
  return v.get<double>();
}

void need_number_or_null(const json& obj, const char* key) {
  const json& v = need(obj, key);
  if (!v.is_null() && !v.is_number()) wrong_type(key, "a number or null", v);
}

// "key 'K' is A but B ...", the form of every count mismatch.
std::string mismatch(const char* key, std::uint64_t value, const std::string& but) {
  return "key '" + std::string(key) + "' is " + std::to_string(value) + " but " + but;
}

}  // namespace

std::vector<std::string> check_trace_summary(const json& s, const TraceTally& tally) {
  if (!s.is_object()) throw DataError("the summary must be an object, got " + std::string(s.type_name()));
  const json& type = need(s, "type");
  if (!type.is_string()) wrong_type("type", "a string", type);
  if (type != "summary")
    throw DataError("key 'type' is '" + type.get<std::string>() + "', expected 'summary'");
  std::vector<std::string> warnings;
  const std::uint64_t steps = need_uint(s, "steps");
  // A reader counts the records itself, so a summary without traced_steps is readable: a warning.
  const bool has_traced = s.contains("traced_steps");
  const std::uint64_t traced = has_traced ? need_uint(s, "traced_steps") : tally.records;
  if (!has_traced)
    warnings.push_back(
        "missing key 'traced_steps' (required by gradscale.trace/1; the records were counted instead)");
  const std::uint64_t skipped = need_uint(s, "skipped");
  const std::uint64_t overflows = need_uint(s, "overflows");
  for (const char* k : {"train_loss", "train_accuracy", "test_loss", "test_accuracy"})
    need_number_or_null(s, k);
  for (const char* k : {"wall_seconds", "scaler_seconds"})
    if (need_number(s, k) < 0) throw DataError("key '" + std::string(k) + "' must be >= 0");
  const json& layers = need(s, "layers");
  if (!layers.is_array()) wrong_type("layers", "an array", layers);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string row = "layers[" + std::to_string(i) + "]: ";
    try {
      if (!layers[i].is_object()) throw DataError("a layer entry must be an object");
      const json& id = need(layers[i], "id");
      if (!id.is_number_integer()) wrong_type("id", "an integer", id);
      if (id.get<std::int64_t>() < 0 || id.get<std::uint64_t>() >= tally.layers)
        throw DataError("key 'id' is " + id.dump() + ", outside the header's layer table (ids 0.." +
                        std::to_string(tally.layers == 0 ? 0 : tally.layers - 1) + ")");
      need_number(layers[i], "mean_underflow_rate");
      need_number(layers[i], "max_underflow_rate");
      // With the fp32 shadow: the means of its upstream figures over the traced steps (null: none).
      if (layers[i].contains("shadow")) {
        const json& shadow = layers[i]["shadow"];
        if (!shadow.is_object() || !shadow.contains("upstream") || !shadow["upstream"].is_object())
          wrong_type("shadow", "an object {\"upstream\": {...}}", shadow);
        for (const char* k : {"underflow_mass", "rel_error", "cosine"})
          need_number_or_null(shadow["upstream"], k);
      }
    } catch (const DataError& e) {
      throw DataError(row + e.what());
    }
  }
  if (traced != tally.records)
    throw DataError(
        mismatch("traced_steps", traced, "the trace has " + std::to_string(tally.records) + " step records"));
  if (tally.records > 0 && steps < tally.last_step)
    throw DataError(mismatch("steps", steps, "a step record has step " + std::to_string(tally.last_step)));
  if (skipped != tally.skipped)
    throw DataError(
        mismatch("skipped", skipped,
                 std::to_string(tally.skipped) + " step records are skipped (every skipped step is traced)"));
  if (overflows != tally.overflows)
    throw DataError(mismatch(
        "overflows", overflows,
        std::to_string(tally.overflows) + " step records have found_inf (every such step is traced)"));
  return warnings;
}

}  // namespace gradscale
