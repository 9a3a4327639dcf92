// `gradscale replay`: runs a loss-scaling policy over a sequence of events without training and prints
// what the policy decides after each one (scale, skipped, counters). Overflow-driven policies take F/I
// events; the statistics-driven popart_als takes gradient counts about its edge. The hand-worked
// sequences of docs/scalers.md are reproduced with it.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/command.h"
#include "experiments/cli/parse.h"
#include "lib/core/error.h"
#include "lib/numeric/format.h"
#include "lib/scaler/scaler.h"

namespace gradscale::cli {
namespace {

constexpr std::uint64_t kMaxEvents = 10'000'000;

const char* const kUsage =
    R"(gradscale replay --scaler SPEC --events EVENTS [--format F]

Runs a loss-scaling policy over events without training. Prints one JSON object per event,
  {"step":k,"found_inf":...,"skipped":...,"scale":S,"state":{...}}
where scale and state (the policy's counters) are the values after that event's update, i.e. what
step k+1 uses. Where the policy raises (deepspeed at its minimum with raise_at_min) it prints
{"step":k,"error":"..."} and exits with status 1.

SPEC    a JSON object {"policy":NAME, ...parameters}, a policy name (e.g. torch), or static:S.
EVENTS  overflow-driven policies: the letters F (clean step) and I (step with found_inf), each
        optionally preceded by a repeat count; spaces and commas are ignored.
          FFI    1999F I    3F,I,2F
        popart_als: tokens [N*][I]L:U separated by commas or spaces, where L and U are the counts of
        weight-gradient values below and at-or-above the edge (bin_edge * max_finite(F)), a leading
        I marks the step as found_inf, and N* repeats the token N times. Its lines also carry
        "below" and "above".
          1000:0,1000:1    15*4096:0    I999:1)";

struct Event {
  bool found_inf = false;
  std::uint64_t below = 0;
  std::uint64_t above = 0;
};

struct Run {
  Event event;
  std::uint64_t count = 1;
};

bool is_separator(char c) {
  return c == ' ' || c == ',' || c == '\t' || c == '\n';
}

// Moves `i` past separators: false at the end of the text, else `i` is where the next token starts.
bool next_token(const std::string& text, std::size_t& i) {
  while (i < text.size() && is_separator(text[i])) ++i;
  return i < text.size();
}

// A decimal count: digits only, at most kMaxEvents unless `any_size` (gradient counts).
std::uint64_t parse_count(std::string_view digits, bool any_size, std::string_view token) {
  GS_CHECK_CONFIG(!digits.empty() && digits.size() <= 19, "--events: bad number in '" << token << "'");
  std::uint64_t v = 0;
  for (const char c : digits) {
    GS_CHECK_CONFIG(c >= '0' && c <= '9', "--events: bad number in '" << token << "'");
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  GS_CHECK_CONFIG(any_size || v <= kMaxEvents,
                  "--events: repeat count " << v << " in '" << token << "' exceeds " << kMaxEvents);
  return v;
}

void add_run(std::vector<Run>& runs, std::uint64_t& total, const Run& run, std::string_view token) {
  GS_CHECK_CONFIG(run.count >= 1, "--events: a repeat count must be at least 1 in '" << token << "'");
  total += run.count;
  GS_CHECK_CONFIG(total <= kMaxEvents, "--events: more than " << kMaxEvents << " events");
  runs.push_back(run);
}

// F/I events: [count]F or [count]I, separators ignored.
std::vector<Run> parse_flag_events(const std::string& text, const std::string& policy) {
  std::vector<Run> runs;
  std::uint64_t total = 0;
  std::size_t i = 0;
  while (next_token(text, i)) {
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    const std::string_view token(text.data() + start, std::min(i + 1, text.size()) - start);
    GS_CHECK_CONFIG(i < text.size() && (text[i] == 'F' || text[i] == 'I'),
                    "--events: expected F or I (optionally after a repeat count) at position "
                        << (i + 1) << " of '" << text << "'; policy " << policy
                        << " takes overflow events such as FFI or 1999F I");
    Run run;
    run.event.found_inf = text[i] == 'I';
    run.count = i > start ? parse_count(std::string_view(text.data() + start, i - start), false, token) : 1;
    add_run(runs, total, run, token);
    ++i;
  }
  GS_CHECK_CONFIG(!runs.empty(), "--events: no events in '" << text << "'");
  return runs;
}

// popart_als events: [N*][I]L:U tokens.
std::vector<Run> parse_statistics_events(const std::string& text) {
  std::vector<Run> runs;
  std::uint64_t total = 0;
  std::size_t i = 0;
  while (next_token(text, i)) {
    const std::size_t start = i;
    while (i < text.size() && !is_separator(text[i])) ++i;
    const std::string_view token(text.data() + start, i - start);
    std::string_view rest = token;
    Run run;
    const std::size_t star = rest.find('*');
    if (star != std::string_view::npos) {
      run.count = parse_count(rest.substr(0, star), false, token);
      rest.remove_prefix(star + 1);
    }
    if (!rest.empty() && rest.front() == 'I') {
      run.event.found_inf = true;
      rest.remove_prefix(1);
    }
    const std::size_t colon = rest.find(':');
    GS_CHECK_CONFIG(colon != std::string_view::npos,
                    "--events: bad statistics event '"
                        << token
                        << "': popart_als takes [N*][I]L:U tokens (counts below:above "
                           "the edge), e.g. 1000:0 or I999:1");
    run.event.below = parse_count(rest.substr(0, colon), true, token);
    run.event.above = parse_count(rest.substr(colon + 1), true, token);
    add_run(runs, total, run, token);
  }
  GS_CHECK_CONFIG(!runs.empty(), "--events: no events in '" << text << "'");
  return runs;
}

// JSON has no inf; a policy whose scale can overflow float32 (megatron) reports it as "inf".
std::string scale_text(double scale) {
  return std::isfinite(scale) ? nlohmann::json(scale).dump()
                              : std::string(scale > 0 ? "\"inf\"" : "\"-inf\"");
}

int run_replay(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string spec;
  std::string events;
  std::string format_text = "fp16";
  desc.add_options()("scaler", po::value(&spec)->required(),
                     "scaler spec: JSON object, policy name or static:S")(
      "events", po::value(&events)->required(), "events to replay (see above)")(
      "format", po::value(&format_text), ("storage format F: " + format_names() + " (default fp16)").c_str());
  po::variables_map vm;
  if (!parse_options(kUsage, desc, args, vm)) return 0;

  const Format format = parse_format(format_text);
  const std::unique_ptr<Scaler> scaler = make_scaler(std::string_view(spec), format);
  const bool statistics = scaler->gradient_edge() > 0;
  const std::vector<Run> runs =
      statistics ? parse_statistics_events(events) : parse_flag_events(events, scaler->policy());

  std::uint64_t step = 0;
  for (const Run& run : runs) {
    for (std::uint64_t k = 0; k < run.count; ++k) {
      ++step;
      StepStatistics stats;
      stats.found_inf = run.event.found_inf;
      stats.grad_below_edge = run.event.below;
      stats.grad_above_edge = run.event.above;
      StepReport report;
      try {
        report = scaler->update(stats);
      } catch (const ScalerError& e) {
        std::cout << "{\"step\":" << step << ",\"error\":" << nlohmann::json(e.what()).dump() << "}"
                  << std::endl;
        return 1;
      }
      std::cout << "{\"step\":" << step;
      if (statistics) std::cout << ",\"below\":" << run.event.below << ",\"above\":" << run.event.above;
      std::cout << ",\"found_inf\":" << (stats.found_inf ? "true" : "false")
                << ",\"skipped\":" << (report.skipped ? "true" : "false")
                << ",\"scale\":" << scale_text(report.scale) << ",\"state\":" << report.state.dump() << "}\n";
    }
  }
  std::cout.flush();
  return 0;
}

}  // namespace

GS_REGISTER_COMMAND("replay", "run a loss-scaling policy over overflow events, without training", run_replay);

}  // namespace gradscale::cli
