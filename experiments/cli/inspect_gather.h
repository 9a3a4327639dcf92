// What `gradscale inspect` gathers from a trace in one pass (trace_file.h): a row per layer and one
// for the loss gradient (log2 S, underflow rates, overflow events, the fp32 shadow, what held s), the
// step nearest to --at, and the header and summary parts it prints, as JSON for inspect_print.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/trace_file.h"

namespace gradscale::cli::inspect {

using json = nlohmann::json;

// Mean, min and max of log2 of a scale over the records it was seen in.
struct Log2Range {
  std::size_t records = 0;
  double sum = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();

  void add(double scale) {
    ++records;
    const double l = std::log2(scale);
    sum += l;
    min = std::min(min, l);
    max = std::max(max, l);
  }
};

// One row of the table: a layer (or the loss gradient) over the traced records it appears in. Both
// S and S_in are followed: which one the row shows (record_scale) is known only after the last step.
struct Row {
  Log2Range by_S, by_S_in;
  std::size_t rated = 0;  // records with an activation gradient
  double rate_sum = 0;
  double rate_max = 0;
  std::size_t with_stats = 0;  // records with statistics (act or wgrad) to look for overflows in
  std::size_t overflow_events = 0;
  // The fp32 shadow's figures (--shadow), summed over the records that have them.
  struct ShadowSum {
    std::size_t records = 0;
    double rel_error = 0, underflow_mass = 0;
  } shadow_upstream, shadow_weight;
  // What held s (the records' "limit": margin, scale_bound, accum_bound, phi), records per kind.
  std::map<std::string, std::size_t> limits;

  static void add_shadow(ShadowSum& sum, const json& m) {
    if (!m["rel_error"].is_number() || !m["underflow_mass"].is_number()) return;
    ++sum.records;
    sum.rel_error += m["rel_error"].get<double>();
    sum.underflow_mass += m["underflow_mass"].get<double>();
  }
  void add_shadow(const json* shadow) {
    if (!shadow) return;
    if (shadow->contains("upstream")) add_shadow(shadow_upstream, (*shadow)["upstream"]);
    if (shadow->contains("weight")) add_shadow(shadow_weight, (*shadow)["weight"]);
  }

  void add(double scale, double scale_in, const json* grad, const json* wgrad) {
    by_S.add(scale);
    by_S_in.add(scale_in);
    if (grad) {
      const double r = stats_underflow_rate(*grad);
      ++rated;
      rate_sum += r;
      rate_max = std::max(rate_max, r);
    }
    if (grad || wgrad) ++with_stats;
    if ((grad && stats_overflowed(*grad)) || (wgrad && stats_overflowed(*wgrad))) ++overflow_events;
  }
};

// What inspect shows, gathered in one pass over the trace (trace_file.h): per-layer rows, the loss
// row, the step nearest to --at, and the parts of the header and summary it prints. It keeps no step
// record but that one, so its memory does not grow with the trace.
class Gathered : public TraceVisitor {
 public:
  // `path` (named in warnings, on stderr as they come, and in run_json) must outlive the Gathered;
  // `at`: the step --at asks for, if any.
  Gathered(const std::string& path, std::optional<std::uint64_t> at) : path_(path), at_(at) {}

  void header(const json& h) override;
  void step(const json& st) override;
  void summary(const json& s) override { summary_ = s; }
  void warning(const std::string& text) override;

  // The header and the run totals, shared by the text and JSON outputs: file, schema, model, format,
  // grad_format, policy, finished, traced_steps, last_traced_step, steps, skipped, overflows, the
  // final losses and accuracies, wall and scaler seconds (null where the run did not finish), warnings.
  json run_json(const TraceScan& scan) const;

  // {"layers": [one row per layer of the header: id, name, kind, records, log2_S {mean, min, max},
  // underflow_rate {mean, max}, overflow_events, shadow, limits], "loss": the loss gradient's row}.
  json table_json() const;

  // The traced step nearest to --at (the earlier on a tie): its step fields and each layer's s, S,
  // log2 S, underflow rate and overflowed values. Throws DataError when the trace has no step record.
  json at_json() const;

  std::size_t layer_count() const { return rows_.size(); }
  const json& summary_json() const { return summary_; }

 private:
  // Whether a layer sends an activation gradient upstream: it has "act" in a record of a step with
  // statistics. A layer without any such record counts as sending one (S is then the scale shown).
  bool sends_act(std::size_t id) const { return !measured_[id] || sends_[id]; }

  // The scale that goes with a layer record: S, the scale of the gradient it sends upstream, or S_in
  // for a layer that sends none (the scale its weight gradient is at).
  double record_scale(const json& l) const;

  // A row's figures as table_json gives them; log2 S of S (by_S) or of S_in.
  static json row_json(const Row& r, bool by_S);

  // The header's "model" (the Model's name), else the run config's "model" (traces written before it).
  static std::string model_name(const json& header);

  static json layer_identity(const json& layer);

  const std::string& path_;
  std::optional<std::uint64_t> at_;
  json header_;
  json summary_;
  std::vector<Row> rows_;
  Row loss_;
  std::vector<bool> measured_, sends_;
  json nearest_;
  std::uint64_t nearest_distance_ = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::string> warnings_;
};

}  // namespace gradscale::cli::inspect
