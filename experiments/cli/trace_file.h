// Reading a trace of `gradscale train --trace` (schema gradscale.trace/1, docs/trace.md) and checking
// that it follows the schema. The readers (`gradscale inspect`) depend only on that contract, never on
// the writer's code, so a trace from any writer (or by hand) is read the same way.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale::cli {

inline constexpr const char* kTraceSchema = "gradscale.trace/1";

// A trace as read from disk: the header, the step records in file order and the summary.
struct Trace {
  std::string path;
  bool lines = false;                    // read from a JSON Lines file
  nlohmann::json header;                 // the header object (null when the file had none)
  std::vector<nlohmann::json> steps;     // the step objects, in file order
  std::vector<std::string> step_origin;  // where each step came from: "line 4" or "steps[2]"
  nlohmann::json summary;                // the summary object; null when the run did not finish
  std::string summary_origin;            // "line 7" or "summary"
  std::vector<std::string> warnings;     // e.g. a cut last line that was dropped
};

// Reads PATH. A `.jsonl` file (or any file whose first line is a header object) is read as JSON Lines:
// one object per line, routed by its "type"; a last line that is not valid JSON (the run died while
// writing it) is dropped with a warning. Anything else is read as the PATH.json document. Throws
// DataError naming the file (and line) when it cannot be read or parsed; does not check the schema.
Trace read_trace(const std::string& path);

// Checks every required key and type of the schema and the rules between fields: the six counts of a
// statistics object sum to "elements", steps increase, layer ids lie in the header's table and ascend
// within a step, S = s * S_in, the summary's counts match the step records. Throws DataError whose
// message names the file, the record (step number and line or index), the layer and the key. A
// deviation the readers can do without (a summary without "traced_steps") is added to
// trace.warnings instead.
void validate_trace(Trace& trace);

// The underflow rate of a statistics object from its counts: underflow / (elements - zero - nonfinite),
// 0 when that is 0. Expects a validated object.
double stats_underflow_rate(const nlohmann::json& stats);

// True when the statistics object saw an overflow or a non-finite value. Expects a validated object.
bool stats_overflowed(const nlohmann::json& stats);

}  // namespace gradscale::cli
