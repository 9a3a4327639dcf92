// `gradscale inspect`: reads a trace (schema gradscale.trace/1, docs/trace.md), checks it against the
// schema and summarises it per layer: how the accumulated scale S moved (log2) and how much of each
// layer's activation gradient underflowed, the question the per-layer method exists to answer.
// The trace is read and gathered by inspect_gather.h, printed by inspect_print.h.
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/command.h"
#include "experiments/cli/inspect_gather.h"
#include "experiments/cli/inspect_print.h"
#include "experiments/cli/parse.h"
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

  inspect::Gathered g(path, at ? std::optional<std::uint64_t>(target) : std::nullopt);
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
  inspect::print_header_line(out);
  if (at) {
    inspect::print_at(out["at"]);
  } else {
    inspect::print_table(out);
    inspect::print_totals(out);
  }
  return 0;
}

}  // namespace

GS_REGISTER_COMMAND("inspect", "check a trace against its schema and summarise it per layer", run_inspect);

}  // namespace gradscale::cli
