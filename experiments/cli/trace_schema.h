// The schema of a trace (gradscale.trace/1, docs/trace.md) as checks, one record at a time, so a
// reader can check a trace of any length while it streams it (trace_file.h). Every check throws
// DataError naming the file, the record (line or index, step number), the layer and the key.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/train/trace_summary.h"

namespace gradscale::cli {

inline constexpr const char* kTraceSchema = "gradscale.trace/1";

// Where a check is: the file and the record, for the message.
struct Where {
  const std::string& path;
  std::string record;  // "step 14 (line 4), layer 3 (fc2)" ...

  [[noreturn]] void fail(const std::string& what) const;
};

// A row of the header's layer table, as the step checks need it.
struct LayerRow {
  std::string name;
  bool parametric = false;      // asks the controller for a local scale (Linear, Conv2d)
  bool has_parameters = false;  // trains parameters (also BatchNorm's γ, β): may carry "wgrad"
};

// The header object: every key with its type, the layer table (ids 0..L-1, inputs earlier ids).
std::vector<LayerRow> check_header(const Where& w, const nlohmann::json& header);

// One step record against the header's table; `previous` is the step number before it (0 for the
// first): counts of each statistics object sum to "elements", steps increase, layer ids lie in the
// table and ascend, S = s * S_in.
void check_step(const Where& w, const nlohmann::json& step, const std::vector<LayerRow>& table,
                bool with_binades, std::uint64_t previous);

// The summary against what the step records added up to (the library's check, the one
// TraceWriter::finish applies); what a reader can do without goes to `warnings`.
void check_summary(const Where& w, const nlohmann::json& summary, const TraceTally& tally,
                   std::vector<std::string>& warnings);

// The parts of a trace document (TRACE.json) around its records: key 'schema', and keys that must
// hold an object or an array.
void check_schema_key(const Where& w, const nlohmann::json& obj);
const nlohmann::json& check_object_key(const Where& w, const nlohmann::json& obj, const char* key);
const nlohmann::json& check_array_key(const Where& w, const nlohmann::json& obj, const char* key);
const char* json_type_name(const nlohmann::json& v);

// The underflow rate of a statistics object from its counts: underflow / (elements - zero - nonfinite),
// 0 when that is 0. Expects a checked object.
double stats_underflow_rate(const nlohmann::json& stats);

// True when the statistics object saw an overflow or a non-finite value. Expects a checked object.
bool stats_overflowed(const nlohmann::json& stats);

}  // namespace gradscale::cli
