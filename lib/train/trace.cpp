// The trace writer (see trace.h).
#include "lib/train/trace.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/scaler/scale_rule.h"
#include "lib/train/checkpoint.h"
#include "lib/train/trace_summary.h"

namespace gradscale {
namespace {

constexpr const char* kSchema = "gradscale.trace/1";

// A double as JSON: non-finite values become null (JSON has no inf), which readers treat as "overflowed".
nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

TraceWriter::TraceWriter(std::string base, nlohmann::json header, std::int64_t every, bool histograms,
                         std::int64_t resume_steps)
    : jsonl_path_(base + ".jsonl"), json_path_(base + ".json"), every_(every), histograms_(histograms) {
  GS_CHECK_CONFIG(!base.empty(), "the trace path is empty");
  GS_CHECK_CONFIG(every >= 1, "trace_every must be >= 1, got " << every);
  std::vector<nlohmann::json> keep;
  if (resume_steps >= 0) {
    std::ifstream probe(jsonl_path_);
    if (probe) {
      const nlohmann::json doc = read_jsonl(jsonl_path_);
      keep.push_back(doc.at("header"));
      for (const auto& s : doc.at("steps"))
        if (s.at("step").get<std::int64_t>() <= resume_steps) keep.push_back(s);
    }
  }
  if (keep.empty()) {
    header["type"] = "header";
    header["schema"] = kSchema;
    header["trace_every"] = every;
    header["trace_hist"] = histograms;
    keep.push_back(std::move(header));
  }
  // Rewrite what is kept (a new file, or the resumed run's lines up to the checkpoint), then append.
  std::string text;
  for (const auto& j : keep) text += j.dump() + "\n";
  write_file_atomic(jsonl_path_, text);
  out_.open(jsonl_path_, std::ios::app);
  GS_CHECK_DATA(out_, "cannot open trace file '" << jsonl_path_ << "' for writing");
  const std::size_t layers = keep.front().value("layers", nlohmann::json::array()).size();
  rate_sum_.assign(layers, 0.0);
  rate_max_.assign(layers, 0.0);
  rate_count_.assign(layers, 0);
  shadow_sum_.assign(layers, {0, 0, 0});
  shadow_count_.assign(layers, {0, 0, 0});
  last_step_ = std::max<std::int64_t>(resume_steps, 0);
  // A resumed run's summary covers the kept steps too.
  for (std::size_t i = 1; i < keep.size(); ++i) {
    const nlohmann::json& s = keep[i];
    ++traced_;
    skipped_ += s.value("skipped", false) ? 1 : 0;
    overflows_ += s.value("found_inf", false) ? 1 : 0;
    last_traced_step_ = s.value("step", std::int64_t{0});
    if (s.contains("S0") && s["S0"].is_number()) {
      last_loss_scale_ = s["S0"].get<double>();
      have_last_ = true;
    }
    for (const auto& l : s.value("layers", nlohmann::json::array()))
      if (l.contains("act") && l["id"].is_number_unsigned() && l["id"].get<std::size_t>() < layers)
        note_rate(l["id"].get<std::size_t>(), l["act"].value("underflow_rate", 0.0));
    for (const auto& l : s.value("layers", nlohmann::json::array()))
      if (l.contains("shadow") && l["shadow"].contains("upstream") && l["id"].is_number_unsigned() &&
          l["id"].get<std::size_t>() < layers)
        note_shadow(l["id"].get<std::size_t>(), l["shadow"]["upstream"]);
  }
}

void TraceWriter::note_rate(std::size_t layer, double rate) {
  rate_sum_[layer] += rate;
  rate_max_[layer] = std::max(rate_max_[layer], rate);
  ++rate_count_[layer];
}

void TraceWriter::note_shadow(std::size_t layer, const nlohmann::json& upstream) {
  const char* const keys[] = {"underflow_mass", "rel_error", "cosine"};
  for (int k = 0; k < 3; ++k) {
    const auto v = upstream.find(keys[k]);  // null (a norm of 0) is left out of the mean
    if (v == upstream.end() || !v->is_number() || !std::isfinite(v->get<double>())) continue;
    shadow_sum_[layer][k] += v->get<double>();
    ++shadow_count_[layer][k];
  }
}

void TraceWriter::write_line(const nlohmann::json& j) {
  out_ << j.dump() << '\n';
  out_.flush();
  GS_CHECK_DATA(out_, "writing the trace file '" << jsonl_path_ << "' failed");
}

TraceWriter::~TraceWriter() = default;

bool TraceWriter::write_step(const TraceStep& s, const StepMonitor& m) {
  last_step_ = std::max(last_step_, s.step);
  std::vector<std::string> why;
  if (samples(s.step)) why.push_back("every");
  if (s.skipped) why.push_back("skip");
  if (m.found_inf) why.push_back("overflow");
  if (have_last_ && s.loss_scale != last_loss_scale_) why.push_back("scale_change");
  last_loss_scale_ = s.loss_scale;
  have_last_ = true;
  if (why.empty()) return false;

  nlohmann::json j = {{"type", "step"},
                      {"step", s.step},
                      {"epoch", s.epoch},
                      {"loss", number(s.loss)},
                      {"S0", number(s.loss_scale)},
                      {"phi", s.phi},
                      {"skipped", s.skipped},
                      {"found_inf", m.found_inf},
                      {"nonfinite", m.nonfinite_stored},
                      {"first_nonfinite_layer",
                       m.found_inf ? nlohmann::json(m.first_nonfinite_layer) : nlohmann::json(nullptr)},
                      {"why", why},
                      {"stats", m.record}};
  if (m.has_loss_grad) j["loss_grad"] = stats_to_json(m.loss_grad, histograms_);
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerRecord& r : m.records) {
    if (!r.ran) continue;
    nlohmann::json l = {{"id", r.layer_id},
                        {"s", r.local_scale},
                        {"unbound_s", number(r.unbound_scale)},
                        {"S_in", number(r.scale_in)},
                        {"S", number(r.scale_out)}};
    if (r.scale_limit != kLimitMethod) l["limit"] = scale_limit_name(r.scale_limit);  // absent: the method's own s
    if (r.has_activation_grad) {
      l["act"] = stats_to_json(r.activation_grad, histograms_);
      const auto id = static_cast<std::size_t>(r.layer_id);
      if (id < rate_sum_.size()) note_rate(id, r.activation_grad.underflow_rate());
    }
    if (r.has_weight_grad) l["wgrad"] = stats_to_json(r.weight_grad, histograms_);
    if (r.weight_grad_scale != 1.0) l["wgrad_scale"] = r.weight_grad_scale;  // SPEC §6.5's r (absent: 1)
    if (r.overflow_upstream || r.overflow_weight || r.overflow_join) {
      nlohmann::json sites = nlohmann::json::array();
      if (r.overflow_upstream) sites.push_back("upstream");
      if (r.overflow_weight) sites.push_back("weight");
      if (r.overflow_join) sites.push_back("join");
      l["overflow"] = {{"sites", sites}, {"max_abs", number(r.overflow_max_abs)}};
    }
    if (r.has_joined_grad) l["join"] = stats_to_json(r.joined_grad, histograms_);
    if (r.has_shadow_upstream || r.has_shadow_weight) {
      nlohmann::json shadow = nlohmann::json::object();
      const auto metrics = [](const ShadowMetrics& sm) {
        return nlohmann::json{{"underflow_mass", number(sm.underflow_mass)}, {"rel_error", number(sm.rel_error)},
                              {"cosine", number(sm.cosine)}};
      };
      if (r.has_shadow_upstream) {
        shadow["upstream"] = metrics(r.shadow_upstream);
        const auto id = static_cast<std::size_t>(r.layer_id);
        if (id < shadow_sum_.size()) note_shadow(id, shadow["upstream"]);
      }
      if (r.has_shadow_weight) shadow["weight"] = metrics(r.shadow_weight);
      l["shadow"] = std::move(shadow);
    }
    layers.push_back(std::move(l));
  }
  j["layers"] = std::move(layers);
  write_line(j);
  ++traced_;
  skipped_ += s.skipped ? 1 : 0;
  overflows_ += m.found_inf ? 1 : 0;
  last_traced_step_ = s.step;
  return true;
}

void TraceWriter::finish(nlohmann::json summary) {
  summary["type"] = "summary";
  summary["traced_steps"] = traced_;
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t i = 0; i < rate_sum_.size(); ++i) {
    if (rate_count_[i] == 0) continue;
    nlohmann::json l = {{"id", i},
                        {"mean_underflow_rate", rate_sum_[i] / static_cast<double>(rate_count_[i])},
                        {"max_underflow_rate", rate_max_[i]}};
    if (shadow_count_[i][0] + shadow_count_[i][1] + shadow_count_[i][2] > 0) {
      nlohmann::json up = nlohmann::json::object();
      const char* const keys[] = {"underflow_mass", "rel_error", "cosine"};
      for (int k = 0; k < 3; ++k)
        up[keys[k]] = shadow_count_[i][k]
                          ? nlohmann::json(shadow_sum_[i][k] / static_cast<double>(shadow_count_[i][k]))
                          : nlohmann::json(nullptr);
      l["shadow"] = {{"upstream", std::move(up)}};
    }
    layers.push_back(std::move(l));
  }
  summary["layers"] = std::move(layers);
  if (!summary.contains("steps")) summary["steps"] = last_step_;
  if (!summary.contains("skipped")) summary["skipped"] = skipped_;
  if (!summary.contains("overflows")) summary["overflows"] = overflows_;
  TraceTally tally;
  tally.records = static_cast<std::uint64_t>(traced_);
  tally.skipped = static_cast<std::uint64_t>(skipped_);
  tally.overflows = static_cast<std::uint64_t>(overflows_);
  tally.last_step = static_cast<std::uint64_t>(last_traced_step_);
  tally.layers = rate_sum_.size();
  try {
    check_trace_summary(summary, tally);
  } catch (const DataError& e) {
    throw ConfigError("trace '" + jsonl_path_ +
                      "': the summary given to TraceWriter::finish is not valid: " + e.what());
  }
  write_line(summary);
  out_.close();
  write_file_atomic(json_path_, read_jsonl(jsonl_path_).dump() + "\n");
}

nlohmann::json TraceWriter::read_jsonl(const std::string& path) {
  std::ifstream in(path);
  GS_CHECK_DATA(in, "cannot open trace file '" << path << "'");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  nlohmann::json doc = {{"schema", kSchema}, {"steps", nlohmann::json::array()}};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json j;
    try {
      j = parse_json(lines[i], "trace line", JsonSource::data);
    } catch (const DataError&) {
      if (i + 1 == lines.size()) break;  // a run killed mid-line: the last line may be cut
      throw DataError("trace file '" + path + "' line " + std::to_string(i + 1) + " is not valid JSON");
    }
    GS_CHECK_DATA(j.is_object() && j.contains("type"),
                  "trace file '" << path << "' line " << i + 1 << " has no \"type\"");
    const std::string type = j["type"].is_string() ? j["type"].get<std::string>() : "";
    if (type == "header")
      doc["header"] = std::move(j);
    else if (type == "step")
      doc["steps"].push_back(std::move(j));
    else if (type == "summary")
      doc["summary"] = std::move(j);
    else
      throw DataError("trace file '" + path + "' line " + std::to_string(i + 1) + ": unknown type '" + type +
                      "'");
  }
  GS_CHECK_DATA(doc.contains("header"), "trace file '" << path << "' has no header line");
  return doc;
}

}  // namespace gradscale
