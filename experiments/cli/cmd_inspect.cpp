// `gradscale inspect`: reads a trace (schema gradscale.trace/1, docs/trace.md), checks it against the
// schema and summarises it per layer: how the accumulated scale S moved (log2) and how much of each
// layer's activation gradient underflowed, the question the per-layer method exists to answer.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/command.h"
#include "experiments/cli/parse.h"
#include "experiments/cli/terminal_text.h"
#include "experiments/cli/trace_file.h"
#include "lib/core/error.h"

namespace gradscale::cli {
namespace {

using nlohmann::json;

const char* const kUsage =
    R"(gradscale inspect TRACE [--check | --json] [--at STEP]

Reads a trace written by `gradscale train --trace` (schema gradscale.trace/1, docs/trace.md): the
TRACE.json document of a finished run, or the TRACE.jsonl lines of a run that may have died (a cut
last line is dropped with a warning). It checks the trace against the schema first, then prints
  a header line  schema, model, format, grad_format, scaler policy, steps, traced steps;
  a table        one row per layer and one for the loss gradient ("loss"): traced records;
                 mean/min/max of log2 S over them (S: the accumulated scale of the gradient the
                 layer sends upstream, S_in for a layer that sends none, S0 for the loss); mean and
                 max underflow rate of that gradient, underflow / (elements - zero - nonfinite);
                 overflow events, the records where that gradient or the weight gradient had an
                 overflow or a non-finite value. "-" where there is nothing to show;
  run totals     steps, traced steps, skipped, overflows (found_inf), final test accuracy and loss,
                 wall and scaler seconds; "run did not finish" when there is no summary.

--at STEP prints one traced step instead of the means: the one nearest to STEP (the earlier on a
tie), with each layer's s, S, log2 S, underflow rate and overflow (values that overflowed or were
non-finite in its activation and weight gradients). --json prints the same as one JSON object on
stdout. --check only validates: "ok: N steps, L layers" (N step records) or the problem.

Exit status: 0 ok; 1 the trace cannot be read or does not follow the schema (the message names the
file, the line or step, the layer and the key); 2 a bad command line.)";

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

// What inspect shows, gathered in one pass over the trace (trace_file.h): per-layer rows, the loss
// row, the step nearest to --at, and the parts of the header and summary it prints. It keeps no step
// record but that one, so its memory does not grow with the trace.
class Gathered : public TraceVisitor {
 public:
  Gathered(const std::string& path, std::optional<std::uint64_t> at) : path_(path), at_(at) {}

  void header(const json& h) override {
    header_ = h;
    const std::size_t n = h["layers"].size();
    rows_.resize(n);
    measured_.assign(n, false);
    sends_.assign(n, false);
  }

  void step(const json& st) override {
    loss_.add(st["S0"].get<double>(), st["S0"].get<double>(), find_stats(st, "loss_grad"), nullptr);
    for (const json& l : st["layers"]) {
      const auto id = l["id"].get<std::size_t>();
      rows_[id].add(l["S"].get<double>(), l["S_in"].get<double>(), find_stats(l, "act"),
                    find_stats(l, "wgrad"));
      rows_[id].add_shadow(find_stats(l, "shadow"));
      if (const auto lim = l.find("limit"); lim != l.end() && lim->is_string()) ++rows_[id].limits[lim->get<std::string>()];
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

  void summary(const json& s) override { summary_ = s; }

  void warning(const std::string& text) override {
    std::cerr << "gradscale inspect: warning: " << path_ << ": " << text << "\n";
    warnings_.push_back(text);
  }

  // The header and the run totals, shared by the text and JSON outputs.
  json run_json(const TraceScan& scan) const {
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

  json table_json() const {
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

  json at_json() const {
    GS_CHECK_DATA(!nearest_.is_null(),
                  path_ << ": the trace has no step records, so --at has nothing to show");
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

  std::size_t layer_count() const { return rows_.size(); }
  const json& summary_json() const { return summary_; }

 private:
  // Whether a layer sends an activation gradient upstream: it has "act" in a record of a step with
  // statistics. A layer without any such record counts as sending one (S is then the scale shown).
  bool sends_act(std::size_t id) const { return !measured_[id] || sends_[id]; }

  // The scale that goes with a layer record: S, the scale of the gradient it sends upstream, or S_in
  // for a layer that sends none (the scale its weight gradient is at).
  double record_scale(const json& l) const {
    return sends_act(l["id"].get<std::size_t>()) ? l["S"].get<double>() : l["S_in"].get<double>();
  }

  static json row_json(const Row& r, bool by_S) {
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
      return s.records ? json{{"records", s.records}, {"rel_error_mean", s.rel_error / n},
                              {"underflow_mass_mean", s.underflow_mass / n}}
                       : json();
    };
    if (r.shadow_upstream.records || r.shadow_weight.records)
      j["shadow"] = {{"upstream", shadow(r.shadow_upstream)}, {"weight", shadow(r.shadow_weight)}};
    if (!r.limits.empty()) j["limits"] = r.limits;
    return j;
  }

  // The header's "model" (the Model's name), else the run config's "model" (traces written before it).
  static std::string model_name(const json& header) {
    const auto named = header.find("model");
    if (named != header.end() && named->is_string()) return named->get<std::string>();
    const json& config = header["config"];
    const auto m = config.find("model");
    return m != config.end() && m->is_string() ? m->get<std::string>() : "-";
  }

  static json layer_identity(const json& layer) {
    return {{"id", layer["id"]}, {"name", layer["name"]}, {"kind", layer["kind"]}};
  }

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

// --- text output --------------------------------------------------------------------------------

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// A number of a JSON value, or "-" when it is null or absent.
std::string fmt(const char* format, const json& v) {
  return v.is_number() ? fmt(format, v.get<double>()) : "-";
}

// A value for the terminal: a string escaped and elided (terminal_text.h), else its JSON text.
std::string text(const json& v) {
  if (v.is_string()) return terminal_text(v.get<std::string>());
  if (v.is_null()) return "-";
  return v.dump();
}

void print_header_line(const json& run) {
  std::cout << terminal_text(run["file"].get<std::string>(), 4096) << ": " << text(run["schema"])
            << ", model " << text(run["model"]) << ", format " << text(run["format"]) << ", grad_format "
            << text(run["grad_format"]) << ", scaler " << text(run["policy"]) << ", ";
  if (run["finished"].get<bool>())
    std::cout << text(run["steps"]) << " steps";
  else
    std::cout << "run did not finish (last traced step " << text(run["last_traced_step"]) << ")";
  std::cout << ", " << text(run["traced_steps"]) << " traced steps\n";
}

struct Columns {
  std::size_t name = 5;  // "layer"
  std::size_t kind = 4;  // "kind"
};

Columns column_widths(const json& layers) {
  Columns c;
  for (const json& l : layers) {
    c.name = std::max(c.name, terminal_text(l["name"].get<std::string>()).size());
    c.kind = std::max(c.kind, terminal_text(l["kind"].get<std::string>()).size());
  }
  return c;
}

void print_cells(const Columns& c, const std::string& id, const std::string& name, const std::string& kind,
                 const std::vector<std::string>& cells, const std::vector<int>& widths) {
  std::printf("%-4s %-*s %-*s", id.c_str(), static_cast<int>(c.name), terminal_text(name).c_str(),
              static_cast<int>(c.kind), terminal_text(kind).c_str());
  for (std::size_t i = 0; i < cells.size(); ++i) std::printf(" %*s", widths[i], cells[i].c_str());
  std::printf("\n");
}

// What held each layer's s, where something other than its method's own choice did: records per kind.
void print_limits(const Columns& c, const json& table) {
  bool any = false;
  for (const json& r : table["layers"]) any = any || r.contains("limits");
  if (!any) return;
  std::printf("\nwhat held s below the method's choice (records; margin: measured's headroom cap, scale_bound: "
              "scale_upper_bound, accum_bound: the bound on the accumulated scale, phi: the safety factor):\n");
  print_cells(c, "id", "layer", "kind", {"records", "held by"}, {7, 0});
  for (const json& r : table["layers"]) {
    if (!r.contains("limits")) continue;
    std::string held;
    for (const auto& [kind, n] : r["limits"].items()) held += (held.empty() ? "" : ", ") + kind + " " + n.dump();
    print_cells(c, text(r["id"]), r["name"].get<std::string>(), r["kind"].get<std::string>(),
                {text(r["records"]), held}, {7, 0});
  }
}

void print_table(const json& table) {
  const Columns c = column_widths(table["layers"]);
  const std::vector<int> widths = {7, 11, 7, 7, 14, 10, 9};
  print_cells(c, "id", "layer", "kind",
              {"records", "log2 S mean", "min", "max", "underflow mean", "max", "overflows"}, widths);
  auto row = [&](const std::string& id, const json& r, const std::string& kind) {
    const json& l2 = r["log2_S"];
    const json& u = r["underflow_rate"];
    const json none;
    print_cells(c, id, r["name"].get<std::string>(), kind,
                {text(r["records"]), fmt("%.3f", l2.is_null() ? none : l2["mean"]),
                 fmt("%.3f", l2.is_null() ? none : l2["min"]), fmt("%.3f", l2.is_null() ? none : l2["max"]),
                 fmt("%.3e", u.is_null() ? none : u["mean"]), fmt("%.3e", u.is_null() ? none : u["max"]),
                 text(r["overflow_events"])},
                widths);
  };
  for (const json& r : table["layers"]) row(text(r["id"]), r, r["kind"].get<std::string>());
  row("-", table["loss"], "loss");
  print_limits(c, table);
  // The fp32 shadow (--shadow): what precision cost each layer's gradients, mean over its records.
  bool any = false;
  for (const json& r : table["layers"]) any = any || r.contains("shadow");
  if (!any) return;
  std::printf("\nagainst the fp32 shadow (mean over the records that have it):\n");
  const std::vector<int> shadow_widths = {7, 14, 14, 7, 14, 14};
  print_cells(c, "id", "layer", "kind",
              {"records", "upstream error", "underflow mass", "records", "weight error", "underflow mass"},
              shadow_widths);
  for (const json& r : table["layers"]) {
    if (!r.contains("shadow")) continue;
    const json& up = r["shadow"]["upstream"];
    const json& w = r["shadow"]["weight"];
    const json none;
    print_cells(c, text(r["id"]), r["name"].get<std::string>(), r["kind"].get<std::string>(),
                {up.is_null() ? "0" : text(up["records"]), fmt("%.3e", up.is_null() ? none : up["rel_error_mean"]),
                 fmt("%.3e", up.is_null() ? none : up["underflow_mass_mean"]), w.is_null() ? "0" : text(w["records"]),
                 fmt("%.3e", w.is_null() ? none : w["rel_error_mean"]),
                 fmt("%.3e", w.is_null() ? none : w["underflow_mass_mean"])},
                shadow_widths);
  }
}

void print_totals(const json& run) {
  if (run["finished"].get<bool>()) {
    std::cout << "run: " << text(run["steps"]) << " steps, " << text(run["traced_steps"]) << " traced, "
              << text(run["skipped"]) << " skipped, " << text(run["overflows"])
              << " overflows (found_inf); test accuracy " << fmt("%.4f", run["test_accuracy"])
              << ", test loss " << fmt("%.4f", run["test_loss"]) << "; wall "
              << fmt("%.4g", run["wall_seconds"]) << " s, scaler " << fmt("%.4g", run["scaler_seconds"])
              << " s\n";
  } else {
    std::cout << "run did not finish: last traced step " << text(run["last_traced_step"]) << ", "
              << text(run["traced_steps"]) << " traced, " << text(run["skipped"]) << " skipped, "
              << text(run["overflows"])
              << " overflows (found_inf) up to it; no final accuracy, loss or times\n";
  }
}

void print_at(const json& at) {
  std::cout << "step " << text(at["step"]) << " (the traced step nearest to " << text(at["requested"])
            << "), epoch " << text(at["epoch"]) << ", loss " << fmt("%.6g", at["loss"]) << ", S0 "
            << fmt("%.6g", at["S0"]) << ", phi " << fmt("%.6g", at["phi"]) << ", skipped "
            << (at["skipped"].get<bool>() ? "yes" : "no") << ", found_inf "
            << (at["found_inf"].get<bool>() ? "yes" : "no");
  if (!at["first_nonfinite_layer"].is_null())
    std::cout << " (first non-finite layer " << text(at["first_nonfinite_layer"]) << ")";
  std::cout << ", why";
  for (const json& r : at["why"]) std::cout << " " << r.get<std::string>();
  if (!at["stats"].get<bool>()) std::cout << "; no statistics (traced between samples)";
  std::cout << "\n";
  const Columns c = column_widths(at["layers"]);
  const std::vector<int> widths = {9, 12, 8, 10, 8};
  print_cells(c, "id", "layer", "kind", {"s", "S", "log2 S", "underflow", "overflow"}, widths);
  for (const json& r : at["layers"]) {
    if (!r["traced"].get<bool>()) {
      print_cells(c, text(r["id"]), r["name"].get<std::string>(), r["kind"].get<std::string>(),
                  {"-", "-", "-", "-", "-"}, widths);
      continue;
    }
    print_cells(c, text(r["id"]), r["name"].get<std::string>(), r["kind"].get<std::string>(),
                {fmt("%.6g", r["s"]), fmt("%.6g", r["S"]), fmt("%.3f", r["log2_S"]),
                 fmt("%.3e", r["underflow_rate"]), text(r["overflow"])},
                widths);
  }
  const json& g = at["loss_grad"];
  print_cells(c, "-", "loss", "loss",
              {"-", fmt("%.6g", g["S"]), fmt("%.3f", g["log2_S"]), fmt("%.3e", g["underflow_rate"]),
               text(g["overflow"])},
              widths);
}

std::uint64_t parse_step(const std::string& s) {
  GS_CHECK_CONFIG(!s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos,
                  "--at: '" << s << "' is not a step number (a non-negative integer)");
  return std::stoull(s);
}

int run_inspect(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string path;
  std::string at_text;
  bool check = false;
  bool as_json = false;
  desc.add_options()("trace", po::value(&path)->required(), "the trace: TRACE.json or TRACE.jsonl")(
      "check", po::bool_switch(&check), "only validate; print \"ok: N steps, L layers\" or the problem")(
      "json", po::bool_switch(&as_json), "print one JSON object on stdout")(
      "at", po::value(&at_text), "show the traced step nearest to STEP instead of the means");
  po::positional_options_description positional;
  positional.add("trace", 1);
  po::variables_map vm;
  if (!parse_options(kUsage, desc, args, vm, &positional)) return 0;
  GS_CHECK_CONFIG(!check || (!as_json && at_text.empty()), "--check takes no --json or --at");
  const bool at = vm.count("at") > 0;
  const std::uint64_t target = at ? parse_step(at_text) : 0;

  Gathered g(path, at ? std::optional<std::uint64_t>(target) : std::nullopt);
  const TraceScan scan = scan_trace(path, g);

  if (check) {
    std::cout << "ok: " << scan.tally.records << " steps, " << g.layer_count() << " layers ("
              << (scan.finished ? "run of " + g.summary_json()["steps"].dump() + " steps"
                                : std::string("no summary: the run did not finish"))
              << ")\n";
    return 0;
  }
  json out = g.run_json(scan);
  if (at) {
    out["at"] = g.at_json();
  } else {
    const json table = g.table_json();
    out["layers"] = table["layers"];
    out["loss"] = table["loss"];
  }
  if (as_json) {
    std::cout << out.dump() << "\n";
    return 0;
  }
  print_header_line(out);
  if (at) {
    print_at(out["at"]);
  } else {
    print_table(out);
    print_totals(out);
  }
  return 0;
}

}  // namespace

GS_REGISTER_COMMAND("inspect", "check a trace against its schema and summarise it per layer", run_inspect);

}  // namespace gradscale::cli
