// Reading traces as a stream (see trace_file.h; the schema's checks are trace_schema.h).
#include "experiments/cli/trace_file.h"

#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_read.h"

namespace gradscale::cli {
namespace {

using nlohmann::json;

// The first line is read to tell JSON Lines from a document; a document is one line, so only this
// much of it is read for that. A header line is far shorter (the config and the layer table).
constexpr std::size_t kMaxHeaderLineBytes = std::size_t{4} << 20;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

// The trace file opened for reading: bounded and non-blocking (lib/core/file_read.h).
class TraceInput {
 public:
  explicit TraceInput(const std::string& path) : path_(path), file_(path, kMaxTraceFileBytes) {
    GS_CHECK_DATA(file_.problem() != ReadProblem::cannot_open,
                  path << ": cannot open the trace (missing or unreadable)");
    check();
  }
  std::istream& stream() { return file_.stream(); }
  // Before reporting what the text held: a device (no size to check at open) read to its end, so
  // that an input over the size cap is reported as that, whatever its first bytes were.
  void check_rest() {
    for (char buffer[1 << 16]; stream().read(buffer, sizeof buffer) || stream().gcount() > 0;) {
    }
    check();
  }
  // After reading: a read that failed or passed the size cap is an error, not an early end.
  void check() const {
    GS_CHECK_DATA(
        file_.problem() == ReadProblem::none,
        read_problem_message(file_.problem(), file_.detail(), "the trace", path_, kMaxTraceFileBytes));
  }

 private:
  const std::string& path_;
  BoundedFile file_;
};

// The first line parses as an object with "type": "header" (read up to kMaxHeaderLineBytes).
bool starts_with_header_line(const std::string& path) {
  TraceInput in(path);
  std::string line;
  for (char c; line.size() <= kMaxHeaderLineBytes && in.stream().get(c) && c != '\n';) line.push_back(c);
  in.check();
  if (line.size() > kMaxHeaderLineBytes) return false;
  const json first = parse_json_or_discarded(line);
  return first.is_object() && first.value("type", json()) == "header";
}

// Checks each part against the schema, keeps the tally and hands the part on.
class Checker {
 public:
  Checker(const std::string& path, TraceVisitor& visitor, TraceScan& scan)
      : path_(path), visitor_(visitor), scan_(scan) {}

  bool has_header() const { return !table_.empty(); }

  void header(const json& h, const std::string& where) {
    table_ = check_header(Where{path_, where}, h);
    with_binades_ = h["trace_hist"].get<bool>();
    scan_.tally.layers = table_.size();
    visitor_.header(h);
  }

  void step(const json& st, const std::string& where) {
    check_step(Where{path_, where}, st, table_, with_binades_, scan_.tally.last_step);
    TraceTally& t = scan_.tally;
    ++t.records;
    t.skipped += st["skipped"].get<bool>();
    t.overflows += st["found_inf"].get<bool>();
    t.last_step = st["step"].get<std::uint64_t>();
    visitor_.step(st);
  }

  void summary(const json& s, const std::string& where) {
    std::vector<std::string> warnings;
    check_summary(Where{path_, where}, s, scan_.tally, warnings);
    for (const std::string& w : warnings) visitor_.warning(w);
    scan_.finished = true;
    visitor_.summary(s);
  }

 private:
  const std::string& path_;
  TraceVisitor& visitor_;
  TraceScan& scan_;
  std::vector<LayerRow> table_;
  bool with_binades_ = false;
};

void scan_lines(const std::string& path, Checker& checker, TraceVisitor& visitor) {
  TraceInput in(path);
  std::string line;
  std::size_t number = 0;
  std::size_t records = 0;
  std::size_t cut = 0;  // the number of a line that did not parse: allowed only as the last one
  bool summary_seen = false;
  while (std::getline(in.stream(), line)) {
    ++number;
    if (is_blank(line)) continue;
    const std::string where = "line " + std::to_string(number);
    GS_CHECK_DATA(cut == 0, path << ": line " << cut << ": not valid JSON");
    json obj = parse_json_or_discarded(line);
    if (obj.is_discarded()) {
      // A run that died mid-write leaves a cut last line; anything earlier is a broken file.
      GS_CHECK_DATA(records > 0,
                    path << ": " << where << ": not valid JSON (the first line must be the header)");
      cut = number;
      continue;
    }
    ++records;
    GS_CHECK_DATA(obj.is_object() && obj.contains("type") && obj["type"].is_string(),
                  path << ": " << where << ": a line must be an object with a string \"type\"");
    const std::string type = obj["type"].get<std::string>();
    GS_CHECK_DATA(!summary_seen, path << ": " << where << ": a '" << type
                                      << "' line after the summary (the summary is the last line)");
    if (records == 1) {
      GS_CHECK_DATA(type == "header", path << ": " << where
                                           << ": the first line must be the header, found type '" << type
                                           << "' (missing header)");
      checker.header(obj, where + " (header)");
    } else if (type == "step") {
      checker.step(obj, where);
    } else if (type == "summary") {
      summary_seen = true;
      checker.summary(obj, where);
    } else {
      GS_CHECK_DATA(type != "header", path << ": " << where << ": a second header line");
      GS_CHECK_DATA(
          false, path << ": " << where << ": unknown type '" << type << "' (allowed: header, step, summary)");
    }
  }
  in.check();
  GS_CHECK_DATA(records > 0 || cut > 0, path << ": the trace is empty (no header line)");
  if (cut > 0)
    visitor.warning("line " + std::to_string(cut) +
                    " is not valid JSON (cut when the run died?) and was ignored");
}

// The document, parsed with a callback that checks and hands on each element of "steps" as soon as
// it is complete and then drops it, so the parsed document never holds more than one step.
void scan_document(const std::string& path, Checker& checker) {
  TraceInput in(path);
  std::string key;        // the top-level key whose value is being parsed
  bool in_steps = false;  // inside the top-level "steps" array
  std::size_t index = 0;
  std::vector<json> early;  // steps before the header (a hand-ordered file): checked once it comes
  json summary;
  auto on_step = [&](json& st) {
    const std::string where = "steps[" + std::to_string(index++) + "]";
    if (checker.has_header())
      checker.step(st, where);
    else
      early.push_back(std::move(st));
  };
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    // As every JSON input (lib/core/json_read.h): deeper nesting is refused while it is parsed, before
    // a recursive copy or destruction of the value could exhaust the stack.
    if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth)
      throw DataError(path + ": not valid JSON (nested deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels)");
    if (depth == 1 && event == E::key) key = parsed.get<std::string>();
    if (depth == 1 && event == E::array_start && key == "steps") in_steps = true;
    if (depth == 1 && event == E::array_end) in_steps = false;
    if (depth == 1 && event == E::object_end && key == "header" && !checker.has_header()) {
      checker.header(parsed, "header");
      for (std::size_t i = 0; i < early.size(); ++i)
        checker.step(early[i], "steps[" + std::to_string(i) + "]");
      early.clear();
    }
    if (depth == 2 && in_steps && (event == E::object_end || event == E::array_end || event == E::value)) {
      on_step(parsed);
      return false;  // dropped from the document
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(in.stream(), callback);
  } catch (const json::parse_error&) {
    in.check_rest();
    GS_CHECK_DATA(false,
                  path << ": not valid JSON (a trace .json is one document; a run that died leaves only "
                          "the .jsonl)");
  } catch (const json::exception& e) {  // out_of_range: a number such as 1e400 that no double holds
    in.check_rest();
    const std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow parsing …"
    const std::size_t id_end = what.find("] ");
    GS_CHECK_DATA(false, path << ": not valid JSON ("
                              << text_excerpt(id_end == std::string::npos ? what : what.substr(id_end + 2))
                              << ")");
  }
  in.check();
  const Where w{path, "document"};
  if (!doc.is_object()) w.fail("the trace must be a JSON object, got " + std::string(json_type_name(doc)));
  check_schema_key(w, doc);
  check_object_key(w, doc, "header");
  check_array_key(w, doc, "steps");
  checker.summary(check_object_key(w, doc, "summary"), "summary");
}

}  // namespace

TraceScan scan_trace(const std::string& path, TraceVisitor& visitor) {
  TraceScan scan;
  Checker checker(path, visitor, scan);
  scan.lines = ends_with(path, ".jsonl") || starts_with_header_line(path);
  if (scan.lines)
    scan_lines(path, checker, visitor);
  else
    scan_document(path, checker);
  return scan;
}

}  // namespace gradscale::cli
