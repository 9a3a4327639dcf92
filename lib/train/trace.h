// Per-layer scale traces (SPEC §8; schema in docs/trace.md): a JSON Lines file written while training
// runs — a header, one line per traced iteration, a summary — flushed line by line so a crash loses at
// most the last line, and at the end one JSON document with the same objects, written atomically.
#pragma once

#include <array>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/instrument/step_monitor.h"

namespace gradscale {

// What the trainer knows about one iteration besides the monitor's per-layer records.
struct TraceStep {
  std::int64_t step = 0;   // 1-based iteration number
  std::int64_t epoch = 0;  // 1-based
  double loss = 0, loss_scale = 1, phi = 1;
  bool skipped = false;
};

class TraceWriter {
 public:
  // Opens `base`.jsonl for writing and writes `header` (which gets "type", "schema", "trace_every" and
  // "trace_hist"; ScaledTraining::trace_header() gives the rest of SPEC §8's header). With
  // `resume_steps` >= 0 the run continues a checkpoint: an existing `base`.jsonl keeps its header and
  // the step lines up to that step (later ones belong to iterations that will be run again).
  TraceWriter(std::string base, nlohmann::json header, std::int64_t every, bool histograms,
              std::int64_t resume_steps = -1);
  // Out of line, like the constructor: the stream is destroyed by the library that made it. Inlined into
  // another module that carries its own static libstdc++ (the plug-in's _core where the compiler links
  // it so), the stream's locale would be released by the other copy, which frees the first copy's
  // static classic locale: `free(): invalid pointer`.
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Whether iteration `step` (1-based) takes full statistics: every `every`-th iteration.
  bool samples(std::int64_t step) const { return step % every_ == 0; }
  // Writes the iteration's line when it was sampled or something notable happened (a skip, found_inf,
  // a change of S0). Returns whether a line was written.
  bool write_step(const TraceStep& s, const StepMonitor& m);
  // Writes the summary line and the JSON document. The writer adds "type", "traced_steps", the
  // per-layer underflow of the traced steps (and the means of the fp32 shadow's upstream figures), and — where `summary` lacks them — "steps", "skipped" and
  // "overflows", which it counts from the step records (every skipped or overflowing iteration is
  // traced; a resumed run's kept records count too, so no counter needs carrying across a resume).
  // The result is checked as `gradscale inspect` checks it (check_trace_summary): a summary a reader
  // would refuse (a key missing or of the wrong type, counts that contradict the records) is a
  // ConfigError, and nothing is written.
  void finish(nlohmann::json summary);

  const std::string& jsonl_path() const { return jsonl_path_; }
  const std::string& json_path() const { return json_path_; }

  // Reads a trace JSON Lines file into the document form {"schema", "header", "steps", "summary"}; a cut
  // last line is dropped. Throws DataError naming the file and line for anything else malformed.
  static nlohmann::json read_jsonl(const std::string& path);

 private:
  void write_line(const nlohmann::json& j);
  void note_rate(std::size_t layer, double rate);
  void note_shadow(std::size_t layer, const nlohmann::json& upstream);

  std::string jsonl_path_, json_path_;
  std::int64_t every_;
  bool histograms_;
  std::ofstream out_;
  double last_loss_scale_ = 0;
  bool have_last_ = false;
  std::int64_t traced_ = 0;
  std::int64_t skipped_ = 0, overflows_ = 0;  // step records with "skipped" / "found_inf"
  std::int64_t last_step_ = 0;                // the last iteration seen (traced or not), 0 before any
  std::int64_t last_traced_step_ = 0;         // the last step record's iteration
  std::vector<double> rate_sum_, rate_max_;   // per layer, act underflow rate over traced steps
  std::vector<std::int64_t> rate_count_;
  // Per layer, the fp32 shadow's upstream figures over the traced steps that have them: sums and
  // counts of the finite values of underflow_mass, rel_error and cosine (in that order).
  std::vector<std::array<double, 3>> shadow_sum_;
  std::vector<std::array<std::int64_t, 3>> shadow_count_;
};

}  // namespace gradscale
