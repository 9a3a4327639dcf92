// Reading a trace of `gradscale train --trace` (schema gradscale.trace/1, docs/trace.md) and checking
// that it follows the schema. The readers (`gradscale inspect`) depend only on that contract, never on
// the writer's code, so a trace from any writer (or by hand) is read the same way. A trace is read as
// a stream, one record at a time: memory does not grow with the number of steps.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "experiments/cli/trace_schema.h"
#include "lib/train/trace_summary.h"

namespace gradscale::cli {

// What a reader does with a trace's parts. Each part reaches it already checked against the schema,
// in file order: the header, each step record, then the summary (none when the run did not finish).
class TraceVisitor {
 public:
  virtual ~TraceVisitor() = default;
  virtual void header(const nlohmann::json& header) { (void)header; }
  virtual void step(const nlohmann::json& step) { (void)step; }
  virtual void summary(const nlohmann::json& summary) { (void)summary; }
  // A deviation the reading can do without (a cut last line, a summary without "traced_steps"), as
  // soon as it is found.
  virtual void warning(const std::string& text) { (void)text; }
};

// What a scan found besides the parts it handed on.
struct TraceScan {
  bool lines = false;     // read as JSON Lines
  bool finished = false;  // the trace has a summary
  TraceTally tally;       // step records, skipped, overflows, the last step, the layers
};

// Reads PATH once from start to end, checks each part as it comes and hands it to VISITOR. Memory
// holds the header, one step record and what the visitor keeps, whatever the trace's length.
// A `.jsonl` file (or any file whose first line is a header object) is read as JSON Lines: one object
// per line, routed by its "type"; a last line that is not valid JSON (the run died while writing it)
// is dropped with a warning. Anything else is read as the TRACE.json document
// {"schema", "header", "steps", "summary"}. Throws DataError at the first problem, reading or schema,
// naming the file, the record (line or index, step number), the layer and the key.
TraceScan scan_trace(const std::string& path, TraceVisitor& visitor);

}  // namespace gradscale::cli
