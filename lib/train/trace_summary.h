// The check of a trace's summary against its step records (docs/trace.md, "summary"): one function,
// used by the writer (TraceWriter::finish refuses a summary a reader would refuse) and by the reader
// (`gradscale inspect --check`), so the two cannot disagree about what a valid summary is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale {

// What a trace's step records add up to.
struct TraceTally {
  std::uint64_t records = 0;    // step records
  std::uint64_t skipped = 0;    // records with "skipped": true
  std::uint64_t overflows = 0;  // records with "found_inf": true
  std::uint64_t last_step = 0;  // the last record's "step" (0 without records)
  std::size_t layers = 0;       // rows of the header's layer table
};

// Checks `summary`: every key of the schema with its type (steps, traced_steps, skipped, overflows,
// the losses and accuracies, wall_seconds, scaler_seconds, the per-layer underflow rows), and that the
// counts match `tally` (every skipped or overflowing iteration is traced, so they match exactly).
// Throws DataError whose message names the key ("key 'overflows' is 2 but 1 step records have
// found_inf ..."), without a file or record: the caller adds where the summary is. Returns warnings for
// what a reader can do without: a summary without "traced_steps".
std::vector<std::string> check_trace_summary(const nlohmann::json& summary, const TraceTally& tally);

}  // namespace gradscale
