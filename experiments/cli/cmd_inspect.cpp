// `gradscale inspect`: reads a trace (schema gradscale.trace/1, docs/trace.md), checks it against the
// schema and summarises it per layer: how the accumulated scale S moved (log2) and how much of each
// layer's activation gradient underflowed, the question the per-layer method exists to answer.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
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

// One row of the table: a layer (or the loss gradient) over the traced records it appears in.
struct Row {
  std::size_t records = 0;
  double log2_sum = 0;
  double log2_min = std::numeric_limits<double>::infinity();
  double log2_max = -std::numeric_limits<double>::infinity();
  std::size_t rated = 0;  // records with an activation gradient
  double rate_sum = 0;
  double rate_max = 0;
  std::size_t with_stats = 0;  // records with statistics (act or wgrad) to look for overflows in
  std::size_t overflow_events = 0;

  void add(double scale, const json* grad, const json* wgrad) {
    ++records;
    const double l = std::log2(scale);
    log2_sum += l;
    log2_min = std::min(log2_min, l);
    log2_max = std::max(log2_max, l);
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

// Per layer: whether it sends an activation gradient upstream, i.e. has "act" in a record of a step
// with statistics. A layer without any such record counts as sending one (S is then the scale shown).
std::vector<bool> layers_sending_act(const Trace& t) {
  const std::size_t n = t.header["layers"].size();
  std::vector<bool> measured(n, false), sends(n, false);
  for (const json& st : t.steps) {
    if (!has_statistics(st)) continue;
    for (const json& l : st["layers"]) {
      const auto id = l["id"].get<std::size_t>();
      measured[id] = true;
      if (l.contains("act")) sends[id] = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!measured[i]) sends[i] = true;
  return sends;
}

// The scale that goes with a layer record: S, the scale of the gradient it sends upstream, or S_in for
// a layer that sends none (the scale its weight gradient is at).
double record_scale(const json& l, const std::vector<bool>& sends_act) {
  return sends_act[l["id"].get<std::size_t>()] ? l["S"].get<double>() : l["S_in"].get<double>();
}

std::uint64_t overflow_values(const json* stats) {
  return stats ? stats->at("overflow").get<std::uint64_t>() + stats->at("nonfinite").get<std::uint64_t>() : 0;
}

// Overflowed and non-finite values of the given statistics together; null when there are none to count.
json overflow_values(const json* a, const json* b) {
  return a || b ? json(overflow_values(a) + overflow_values(b)) : json();
}

struct Summary {
  std::vector<Row> layers;
  Row loss;
};

Summary summarise(const Trace& t) {
  Summary s;
  s.layers.resize(t.header["layers"].size());
  const std::vector<bool> sends_act = layers_sending_act(t);
  for (const json& st : t.steps) {
    s.loss.add(st["S0"].get<double>(), find_stats(st, "loss_grad"), nullptr);
    for (const json& l : st["layers"])
      s.layers[l["id"].get<std::size_t>()].add(record_scale(l, sends_act), find_stats(l, "act"),
                                               find_stats(l, "wgrad"));
  }
  return s;
}

json row_json(const Row& r) {
  json j = {{"records", r.records}};
  j["log2_S"] = r.records ? json{{"mean", r.log2_sum / static_cast<double>(r.records)},
                                 {"min", r.log2_min},
                                 {"max", r.log2_max}}
                          : json();
  j["underflow_rate"] =
      r.rated ? json{{"mean", r.rate_sum / static_cast<double>(r.rated)}, {"max", r.rate_max}} : json();
  j["overflow_events"] = r.with_stats ? json(r.overflow_events) : json();
  return j;
}

// The header's "model" (the Model's name), else the run config's "model" (traces written before it).
std::string model_name(const json& header) {
  const auto named = header.find("model");
  if (named != header.end() && named->is_string()) return named->get<std::string>();
  const json& config = header["config"];
  const auto m = config.find("model");
  return m != config.end() && m->is_string() ? m->get<std::string>() : "-";
}

bool finished(const Trace& t) {
  return !t.summary.is_null();
}

std::uint64_t count_records(const Trace& t, const char* flag) {
  std::uint64_t n = 0;
  for (const json& st : t.steps) n += st[flag].get<bool>() ? 1 : 0;
  return n;
}

// The header and the run totals, shared by the text and JSON outputs.
json run_json(const Trace& t) {
  const json& h = t.header;
  json j = {{"file", t.path},
            {"schema", h["schema"]},
            {"model", model_name(h)},
            {"format", h["format"]},
            {"grad_format", h["grad_format"]},
            {"policy", h["scaler"]["policy"]},
            {"finished", finished(t)},
            {"traced_steps", t.steps.size()},
            {"last_traced_step", t.steps.empty() ? json() : t.steps.back()["step"]}};
  if (finished(t)) {
    const json& s = t.summary;
    j["steps"] = s["steps"];
    for (const char* k : {"skipped", "overflows", "train_loss", "train_accuracy", "test_loss",
                          "test_accuracy", "wall_seconds", "scaler_seconds"})
      j[k] = s[k];
  } else {
    // Every skipped or found_inf iteration is traced, so the records count them up to the last one.
    j["steps"] = json();
    j["skipped"] = count_records(t, "skipped");
    j["overflows"] = count_records(t, "found_inf");
    for (const char* k :
         {"train_loss", "train_accuracy", "test_loss", "test_accuracy", "wall_seconds", "scaler_seconds"})
      j[k] = json();
  }
  j["warnings"] = t.warnings;
  return j;
}

json layer_identity(const json& layer) {
  return {{"id", layer["id"]}, {"name", layer["name"]}, {"kind", layer["kind"]}};
}

json table_json(const Trace& t, const Summary& s) {
  json layers = json::array();
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    json row = layer_identity(t.header["layers"][i]);
    row.update(row_json(s.layers[i]));
    layers.push_back(std::move(row));
  }
  json loss = {{"name", "loss"}};
  loss.update(row_json(s.loss));
  return {{"layers", std::move(layers)}, {"loss", std::move(loss)}};
}

// The traced step nearest to `target` (the earlier on a tie).
const json& nearest_step(const Trace& t, std::uint64_t target) {
  GS_CHECK_DATA(!t.steps.empty(), t.path << ": the trace has no step records, so --at has nothing to show");
  const json* best = &t.steps.front();
  std::uint64_t best_distance = std::numeric_limits<std::uint64_t>::max();
  for (const json& st : t.steps) {
    const std::uint64_t k = st["step"].get<std::uint64_t>();
    const std::uint64_t d = k > target ? k - target : target - k;
    if (d < best_distance) {
      best_distance = d;
      best = &st;
    }
  }
  return *best;
}

json at_json(const Trace& t, const json& st, std::uint64_t target) {
  json at = {{"requested", target}};
  for (const char* k :
       {"step", "epoch", "loss", "S0", "phi", "skipped", "found_inf", "first_nonfinite_layer", "why"})
    at[k] = st[k];
  const std::vector<bool> sends_act = layers_sending_act(t);
  json layers = json::array();
  for (const json& layer : t.header["layers"]) {
    json row = layer_identity(layer);
    row["traced"] = false;
    for (const json& l : st["layers"]) {
      if (l["id"] != layer["id"]) continue;
      const json* act = find_stats(l, "act");
      const json* wgrad = find_stats(l, "wgrad");
      row["traced"] = true;
      row["s"] = l["s"];
      row["S"] = record_scale(l, sends_act);
      row["log2_S"] = std::log2(record_scale(l, sends_act));
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
  std::cout << terminal_text(run["file"].get<std::string>(), 4096) << ": " << text(run["schema"]) << ", model "
            << text(run["model"]) << ", format " << text(run["format"]) << ", grad_format "
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

  Trace t = read_trace(path);
  auto print_warnings = [&](std::size_t from) {
    for (std::size_t i = from; i < t.warnings.size(); ++i)
      std::cerr << "gradscale inspect: warning: " << path << ": " << t.warnings[i] << "\n";
  };
  print_warnings(0);  // before validation: a cut last line explains a later error
  const std::size_t read_warnings = t.warnings.size();
  validate_trace(t);
  print_warnings(read_warnings);

  if (check) {
    std::cout << "ok: " << t.steps.size() << " steps, " << t.header["layers"].size() << " layers ("
              << (finished(t) ? "run of " + t.summary["steps"].dump() + " steps"
                              : std::string("no summary: the run did not finish"))
              << ")\n";
    return 0;
  }
  json out = run_json(t);
  if (at) {
    out["at"] = at_json(t, nearest_step(t, target), target);
  } else {
    const json table = table_json(t, summarise(t));
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
