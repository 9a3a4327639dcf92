// Traces read as a stream (experiments/cli/trace_file.h): the reader hands on one checked record at a
// time, so a trace of any length needs the memory of one step; the document is parsed with its steps
// dropped as they are checked. Also names on the terminal: ablation labels and keys with control
// characters are refused, and no error message carries one.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/trace_file.h"
#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "tests/cli_case.h"
#include "tests/temp_dir.h"

namespace {

using Catch::Matchers::Contains;
using namespace gradscale::test;
using gradscale::testing::TempDir;
using json = nlohmann::json;

const std::string kData = std::string(GRADSCALE_SOURCE_DIR) + "/tests/data/";

// What a scan handed on, in order.
struct Recorder : gradscale::cli::TraceVisitor {
  std::vector<std::string> events;
  void header(const json&) override { events.push_back("header"); }
  void step(const json& st) override { events.push_back("step " + st["step"].dump()); }
  void summary(const json&) override { events.push_back("summary"); }
  void warning(const std::string& text) override { events.push_back("warning: " + text); }
};

std::string joined_events(const Recorder& r) {
  std::string s;
  for (const auto& e : r.events) s += e + "; ";
  return s;
}

// The same checks on a file written as `text`, through a scan that records nothing.
void require_scan_error(const TempDir& tmp, const std::string& name, const std::string& text,
                        const std::string& part) {
  write_text(tmp / name, text);
  gradscale::cli::TraceVisitor none;
  CHECK_THROWS_WITH(gradscale::cli::scan_trace(tmp / name, none), Contains(part));
}

bool has_control(const std::string& s) {
  for (const char c : s)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) return true;
  return false;
}

}  // namespace

TEST_CASE("BoundedFile streams a file, refuses a FIFO and stops a device at the cap", "[io]") {
  using namespace gradscale;
  TempDir tmp;
  write_text(tmp / "a.txt", "one\ntwo\n");
  {
    BoundedFile f(tmp / "a.txt", 8);
    std::string a, b;
    std::getline(f.stream(), a);
    std::getline(f.stream(), b);
    CHECK(a == "one");
    CHECK(b == "two");
    CHECK(f.problem() == ReadProblem::none);
  }
  CHECK(BoundedFile(tmp / "a.txt", 7).problem() == ReadProblem::too_large);
  REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0644) == 0);
  BoundedFile fifo(tmp / "fifo", 1024);
  CHECK(fifo.problem() == ReadProblem::not_regular);
  CHECK(fifo.stream().get() == std::char_traits<char>::eof());
  CHECK(BoundedFile(tmp / "missing", 1024).problem() == ReadProblem::cannot_open);
  BoundedFile zero("/dev/zero", 1 << 20);
  REQUIRE(zero.problem() == ReadProblem::none);
  std::size_t n = 0;
  while (zero.stream().get() != std::char_traits<char>::eof()) ++n;
  CHECK(n == std::size_t{1} << 16 << 4);  // whole 64 KiB reads up to the cap, then the end
  CHECK(zero.problem() == ReadProblem::too_large);
}

TEST_CASE("scan_trace hands on the header, each checked step and the summary, in file order", "[trace]") {
  Recorder doc;
  const auto s = gradscale::cli::scan_trace(kData + "trace_small.json", doc);
  CHECK_FALSE(s.lines);
  CHECK(s.finished);
  CHECK(s.tally.records == 4);
  CHECK(s.tally.skipped == 1);
  CHECK(s.tally.layers == 4);
  CHECK(joined_events(doc) == "header; step 10; step 13; step 14; step 20; summary; ");

  Recorder lines;
  const auto l = gradscale::cli::scan_trace(kData + "trace_small.jsonl", lines);
  CHECK(l.lines);
  CHECK_FALSE(l.finished);
  CHECK(l.tally.records == 3);
  REQUIRE(lines.events.size() == 5);
  CHECK(lines.events[3] == "step 14");
  CHECK_THAT(lines.events[4], Contains("is not valid JSON (cut when the run died?)"));
}

TEST_CASE("scan_trace reads a document in any key order and checks what the callback drops", "[trace]") {
  TempDir tmp;
  std::ifstream in(kData + "trace_small.json");
  const json good = json::parse(in);

  // Steps before the header (a hand-written file): held until the header comes, then checked.
  const std::string reordered = R"({"steps":)" + good["steps"].dump() + R"(,"summary":)" +
                                good["summary"].dump() + R"(,"schema":"gradscale.trace/1","header":)" +
                                good["header"].dump() + "}";
  write_text(tmp / "reordered.json", reordered);
  Recorder r;
  const auto s = gradscale::cli::scan_trace(tmp / "reordered.json", r);
  CHECK(s.tally.records == 4);
  CHECK(joined_events(r) == "header; step 10; step 13; step 14; step 20; summary; ");

  // Elements of "steps" that are not objects are checked, not silently dropped.
  json d = good;
  d["steps"][1] = json::array({1, 2});
  require_scan_error(tmp, "array.json", d.dump(), "steps[1]: a step record must be an object, got array");
  d = good;
  d["steps"][2] = 7;
  require_scan_error(tmp, "number.json", d.dump(), "steps[2]: a step record must be an object, got number");
  d = good;
  d["steps"] = json::object();
  require_scan_error(tmp, "object.json", d.dump(), "document: key 'steps' must be an array");
  // A syntax error after valid records, and a cut document.
  std::string cut = good.dump();
  require_scan_error(tmp, "cut.json", cut.substr(0, cut.size() / 2),
                     "not valid JSON (a trace .json is one document");
  // A JSON Lines line that does not parse, followed by another line.
  std::ifstream jl(kData + "trace_small.jsonl");
  std::string first;
  std::getline(jl, first);
  require_scan_error(tmp, "mid.jsonl", first + "\n{\"type\":\"step\"\n" + first + "\n",
                     "line 2: not valid JSON");
}

TEST_CASE("a one-line document longer than the header peek is read as a document", "[trace]") {
  TempDir tmp;
  std::ifstream in(kData + "trace_small.json");
  json d = json::parse(in);
  d["header"]["config"]["note"] = std::string(std::size_t{5} << 20, 'x');  // the line passes 4 MiB
  write_text(tmp / "long.json", d.dump());
  Recorder r;
  const auto s = gradscale::cli::scan_trace(tmp / "long.json", r);
  CHECK_FALSE(s.lines);
  CHECK(s.tally.records == 4);
}

TEST_CASE("inspect gives the same answer for a trace and the same trace with its steps repeated",
          "[cli][trace]") {
  // The gathering is one pass with per-layer accumulators: a trace of many steps must give the means
  // of its records. Repeating the hand-written fixture's steps (renumbered) leaves every mean, min and
  // max as it is.
  TempDir tmp;
  std::ifstream in(kData + "trace_by_hand.json");
  json d = json::parse(in);
  json steps = json::array();
  for (int k = 0; k < 50; ++k)
    for (json st : d["steps"]) {
      st["step"] = st["step"].get<int>() + 100 * k;
      steps.push_back(st);
    }
  d["steps"] = steps;
  d["summary"]["steps"] = 100 * 50;
  d["summary"]["traced_steps"] = steps.size();
  d["summary"]["skipped"] = 50;
  d["summary"]["overflows"] = d["summary"]["overflows"].get<int>() * 50;
  write_text(tmp / "long.json", d.dump());
  const CliResult one = run_cli("inspect --json " + kData + "trace_by_hand.json");
  const CliResult many = run_cli("inspect --json '" + (tmp / "long.json") + "'");
  INFO(joined(many));
  REQUIRE(one.status == 0);
  REQUIRE(many.status == 0);
  const json a = json::parse(one.lines.back());
  const json b = json::parse(many.lines.back());
  for (std::size_t i = 0; i < a["layers"].size(); ++i) {
    CHECK(b["layers"][i]["records"] == 50 * a["layers"][i]["records"].get<int>());
    const json& la = a["layers"][i]["log2_S"];
    const json& lb = b["layers"][i]["log2_S"];
    REQUIRE(la.is_null() == lb.is_null());  // a layer without records has none in either
    if (la.is_null()) continue;
    CHECK(lb["min"] == la["min"]);
    CHECK(lb["max"] == la["max"]);
    CHECK(lb["mean"].get<double>() == Approx(la["mean"].get<double>()).epsilon(1e-12));
    CHECK(b["layers"][i]["underflow_rate"] == a["layers"][i]["underflow_rate"]);
  }
  CHECK(b["traced_steps"] == 200);
}

TEST_CASE("ablation labels and keys with control characters are refused",
          "[ablate][cli]") {
  TempDir tmp;
  const std::string base = R"({"base":{"data":"synthetic:64","model":"mlp","batch":32,"max_steps":2},)";
  write_text(tmp / "label.json", base + R"("axes":{"scaler":[{"label":"a\u001b[2Jb","value":"none"}]}})");
  check_error(in_dir(tmp, "ablate label.json --dry-run"), 2,
              "label 'a?[2Jb' contains a control character (byte 0x1b)");
  write_text(tmp / "variant.json", base + R"("variants":[{"label":"x\u0007","lr":0.01}]})");
  check_error(in_dir(tmp, "ablate variant.json --dry-run"), 2, "contains a control character (byte 0x07)");
  write_text(tmp / "key.json", base + R"("axes":{"col\r":[{"label":"a","set":{"lr":0.01}}]}})");
  check_error(in_dir(tmp, "ablate key.json --dry-run"), 2,
              "axis 'col?' contains a control character (byte 0x0d)");
  for (const char* f : {"label.json", "variant.json", "key.json"})
    CHECK_FALSE(has_control(joined(in_dir(tmp, std::string("ablate ") + f + " --dry-run"))));
}

TEST_CASE("error messages never put a control character on the terminal", "[cli]") {
  TempDir tmp;
  const CliResult r =
      in_dir(tmp, "train --model \"$(printf 'mlp\\033[2J')\" --data synthetic:64 --max-steps 1");
  INFO(joined(r));
  CHECK(r.status == 2);
  CHECK_THAT(joined(r), Contains("mlp\\e[2J"));
  CHECK_FALSE(has_control(joined(r)));
}

TEST_CASE("a trace .json with a number no double holds is a one-line error naming the file",
          "[trace][cli]") {
  TempDir tmp;
  std::ifstream in(kData + "trace_small.json");
  json d = json::parse(in);
  d["header"]["config"]["epochs"] = 918273645;
  std::string text = d.dump();
  text.replace(text.find("918273645"), 9, "1e400");
  require_scan_error(tmp, "t.json", text, "t.json: not valid JSON (number overflow parsing '1e400')");
  text.replace(text.find("1e400"), 5, "-1e400");
  require_scan_error(tmp, "n.json", text, "n.json: not valid JSON (number overflow parsing '-1e400')");
  const gradscale::test::CliResult r = gradscale::test::run_cli("inspect '" + (tmp / "t.json") + "'");
  CHECK(r.status == 1);  // a trace that cannot be read, as docs/trace.md gives it
  REQUIRE(r.lines.size() == 1);
  CHECK_THAT(r.lines[0],
             Contains("gradscale inspect: ") && Contains("t.json: not valid JSON (number overflow"));
  CHECK_THAT(r.lines[0], !Contains("json.exception"));
}
