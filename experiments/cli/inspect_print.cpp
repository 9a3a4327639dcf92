// The text output of `gradscale inspect` (see inspect_print.h): fixed-width columns, numbers in printf
// formats, names escaped and elided for the terminal (terminal_text.h).
#include "experiments/cli/inspect_print.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "experiments/cli/terminal_text.h"

namespace gradscale::cli::inspect {

using json = nlohmann::json;

namespace {

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

}  // namespace

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

namespace {

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
  std::printf(
      "\nwhat held s below the method's choice (records; margin: measured's headroom cap, scale_bound: "
      "scale_upper_bound, accum_bound: the bound on the accumulated scale, phi: the safety factor):\n");
  print_cells(c, "id", "layer", "kind", {"records", "held by"}, {7, 0});
  for (const json& r : table["layers"]) {
    if (!r.contains("limits")) continue;
    std::string held;
    for (const auto& [kind, n] : r["limits"].items())
      held += (held.empty() ? "" : ", ") + kind + " " + n.dump();
    print_cells(c, text(r["id"]), r["name"].get<std::string>(), r["kind"].get<std::string>(),
                {text(r["records"]), held}, {7, 0});
  }
}

}  // namespace

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
    print_cells(
        c, text(r["id"]), r["name"].get<std::string>(), r["kind"].get<std::string>(),
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

}  // namespace gradscale::cli::inspect
