// What `gradscale inspect` gathers from a trace (see inspect_gather.h): the rows, the step nearest to
// --at and the run totals, each as the JSON that the text output and --json print.
#include "experiments/cli/inspect_gather.h"

#include <algorithm>
#include <iostream>

#include "lib/core/error.h"

namespace gradscale::cli::inspect {
namespace {

const json* find_stats(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool has_statistics(const json& step) {
  return step.value("stats", true);
}

std::uint64_t overflow_values(const json* stats) {
  return stats ? stats->at("overflow").get<std::uint64_t>() + stats->at("nonfinite").get<std::uint64_t>() : 0;
}

// Overflowed and non-finite values of the given statistics together; null when there are none to count.
json overflow_values(const json* a, const json* b) {
  return a || b ? json(overflow_values(a) + overflow_values(b)) : json();
}

}  // namespace

void Gathered::header(const json& h) {
  header_ = h;
  const std::size_t n = h["layers"].size();
  rows_.resize(n);
  measured_.assign(n, false);
  sends_.assign(n, false);
}

void Gathered::step(const json& st) {
  loss_.add(st["S0"].get<double>(), st["S0"].get<double>(), find_stats(st, "loss_grad"), nullptr);
  for (const json& l : st["layers"]) {
    const auto id = l["id"].get<std::size_t>();
    rows_[id].add(l["S"].get<double>(), l["S_in"].get<double>(), find_stats(l, "act"),
                  find_stats(l, "wgrad"));
    rows_[id].add_shadow(find_stats(l, "shadow"));
    if (const auto lim = l.find("limit"); lim != l.end() && lim->is_string())
      ++rows_[id].limits[lim->get<std::string>()];
    if (!has_statistics(st)) continue;
    measured_[id] = true;
    if (l.contains("act")) sends_[id] = true;
  }
  if (at_) {
    const std::uint64_t k = st["step"].get<std::uint64_t>();
    const std::uint64_t d = k > *at_ ? k - *at_ : *at_ - k;
    if (d < nearest_distance_) {
      nearest_distance_ = d;
      nearest_ = st;
    }
  }
}

void Gathered::warning(const std::string& text) {
  std::cerr << "gradscale inspect: warning: " << path_ << ": " << text << "\n";
  warnings_.push_back(text);
}

json Gathered::run_json(const TraceScan& scan) const {
  const json& h = header_;
  json j = {{"file", path_},
            {"schema", h["schema"]},
            {"model", model_name(h)},
            {"format", h["format"]},
            {"grad_format", h["grad_format"]},
            {"policy", h["scaler"]["policy"]},
            {"finished", scan.finished},
            {"traced_steps", scan.tally.records},
            {"last_traced_step", scan.tally.records ? json(scan.tally.last_step) : json()}};
  if (scan.finished) {
    j["steps"] = summary_["steps"];
    for (const char* k : {"skipped", "overflows", "train_loss", "train_accuracy", "test_loss",
                          "test_accuracy", "wall_seconds", "scaler_seconds"})
      j[k] = summary_[k];
  } else {
    // Every skipped or found_inf iteration is traced, so the records count them up to the last one.
    j["steps"] = json();
    j["skipped"] = scan.tally.skipped;
    j["overflows"] = scan.tally.overflows;
    for (const char* k :
         {"train_loss", "train_accuracy", "test_loss", "test_accuracy", "wall_seconds", "scaler_seconds"})
      j[k] = json();
  }
  j["warnings"] = warnings_;
  return j;
}

json Gathered::table_json() const {
  json layers = json::array();
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    json row = layer_identity(header_["layers"][i]);
    row.update(row_json(rows_[i], sends_act(i)));
    layers.push_back(std::move(row));
  }
  json loss = {{"name", "loss"}};
  loss.update(row_json(loss_, true));
  return {{"layers", std::move(layers)}, {"loss", std::move(loss)}};
}

json Gathered::at_json() const {
  GS_CHECK_DATA(!nearest_.is_null(), path_ << ": the trace has no step records, so --at has nothing to show");
  const json& st = nearest_;
  json at = {{"requested", *at_}};
  for (const char* k :
       {"step", "epoch", "loss", "S0", "phi", "skipped", "found_inf", "first_nonfinite_layer", "why"})
    at[k] = st[k];
  json layers = json::array();
  for (const json& layer : header_["layers"]) {
    json row = layer_identity(layer);
    row["traced"] = false;
    for (const json& l : st["layers"]) {
      if (l["id"] != layer["id"]) continue;
      const json* act = find_stats(l, "act");
      const json* wgrad = find_stats(l, "wgrad");
      const double scale = record_scale(l);
      row["traced"] = true;
      row["s"] = l["s"];
      row["S"] = scale;
      row["log2_S"] = std::log2(scale);
      row["underflow_rate"] = act ? json(stats_underflow_rate(*act)) : json();
      row["overflow"] = overflow_values(act, wgrad);
    }
    layers.push_back(std::move(row));
  }
  at["layers"] = std::move(layers);
  const json* g = find_stats(st, "loss_grad");
  at["stats"] = has_statistics(st);
  at["loss_grad"] = {{"name", "loss"},
                     {"S", st["S0"]},
                     {"log2_S", std::log2(st["S0"].get<double>())},
                     {"underflow_rate", g ? json(stats_underflow_rate(*g)) : json()},
                     {"overflow", overflow_values(g, nullptr)}};
  return at;
}

double Gathered::record_scale(const json& l) const {
  return sends_act(l["id"].get<std::size_t>()) ? l["S"].get<double>() : l["S_in"].get<double>();
}

json Gathered::row_json(const Row& r, bool by_S) {
  const Log2Range& l = by_S ? r.by_S : r.by_S_in;
  json j = {{"records", l.records}};
  j["log2_S"] = l.records
                    ? json{{"mean", l.sum / static_cast<double>(l.records)}, {"min", l.min}, {"max", l.max}}
                    : json();
  j["underflow_rate"] =
      r.rated ? json{{"mean", r.rate_sum / static_cast<double>(r.rated)}, {"max", r.rate_max}} : json();
  j["overflow_events"] = r.with_stats ? json(r.overflow_events) : json();
  const auto shadow = [](const Row::ShadowSum& s) {
    const double n = static_cast<double>(s.records);
    return s.records ? json{{"records", s.records},
                            {"rel_error_mean", s.rel_error / n},
                            {"underflow_mass_mean", s.underflow_mass / n}}
                     : json();
  };
  if (r.shadow_upstream.records || r.shadow_weight.records)
    j["shadow"] = {{"upstream", shadow(r.shadow_upstream)}, {"weight", shadow(r.shadow_weight)}};
  if (!r.limits.empty()) j["limits"] = r.limits;
  return j;
}

std::string Gathered::model_name(const json& header) {
  const auto named = header.find("model");
  if (named != header.end() && named->is_string()) return named->get<std::string>();
  const json& config = header["config"];
  const auto m = config.find("model");
  return m != config.end() && m->is_string() ? m->get<std::string>() : "-";
}

json Gathered::layer_identity(const json& layer) {
  return {{"id", layer["id"]}, {"name", layer["name"]}, {"kind", layer["kind"]}};
}

}  // namespace gradscale::cli::inspect
