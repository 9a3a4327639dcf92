// Tests of scripts/plot_trace.py on the trace fixtures: titles for both formats, only the steps with
// statistics mapped, and the scales, underflow and loss PNGs; it skips itself visibly (exit 4) when
// /usr/bin/python3 has no matplotlib.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli_run.h"
#include "tests/trace_tools_fixtures.h"

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_cli;
using gradscale::test::run_shell;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace gradscale::test::trace_tools_fixtures;

// The pieces of the plots a reader must be able to trust, without matplotlib: the title names the
// gradient format too, and the heat map's columns are the steps with statistics only (a "stats": false
// record is no grey stripe), its skips and overflows marked on the axis.
TEST_CASE("plot_trace.py titles both formats and maps only the steps with statistics", "[trace][plot]") {
  if (access(kPython.c_str(), X_OK) != 0) return skip_test(kPython + " not found (install python3)");
  const TempDir dir;
  write_text(dir.file("probe.py"), R"(import sys
sys.path.insert(0, sys.argv[1])
import plot_trace as p
header = {"format": "fp16", "grad_format": "fp8_e5m2", "config": {"model": "cnn"},
          "scaler": {"policy": "adaptive"}}
print(p.plot_title("run", header))
steps = [{"step": 10}, {"step": 13, "stats": False, "skipped": True, "found_inf": True},
         {"step": 15, "stats": False, "found_inf": True}, {"step": 20, "stats": True}]
print([st["step"] for st in p.statistics_steps(steps)])
print(p.event_steps(steps))
)");
  const CliResult r =
      run_shell(kPython + " '" + dir.file("probe.py") + "' '" + GRADSCALE_SOURCE_DIR + "/scripts'");
  REQUIRE(r.status == 0);
  REQUIRE(r.lines.size() == 3);
  CHECK(r.lines[0] == "run: cnn, fp16 / grad fp8_e5m2, scaler adaptive");
  CHECK(r.lines[1] == "[10, 20]");
  CHECK(r.lines[2] == "([13], [13, 15])");
}

TEST_CASE("plot_trace.py draws the scales, underflow and loss PNGs of the fixture", "[trace][plot]") {
  if (access(kPython.c_str(), X_OK) != 0) return skip_test(kPython + " not found (install python3)");
  if (run_shell(kPython + " -c 'import matplotlib'").status != 0)
    return skip_test(kPython + " has no matplotlib (install python3-matplotlib, or run scripts/setup.sh)");
  const std::string script = std::string(GRADSCALE_SOURCE_DIR) + "/scripts/plot_trace.py";
  const TempDir dir;
  for (const char* name : {"trace_small.json", "trace_small.jsonl"}) {
    const std::string out = dir.file(name);  // one directory per input
    const CliResult r = run_shell(kPython + " " + script + " " + kData + name + " --out '" + out + "'");
    INFO(name);
    REQUIRE(r.status == 0);
    std::vector<std::string> written;
    for (const std::string& line : r.lines)
      if (line.find("warning") == std::string::npos) written.push_back(line);
    REQUIRE(written.size() == 3);
    for (const char* kind : {"scales", "underflow", "loss"}) {
      const std::string png = out + "/trace_small." + kind + ".png";
      CHECK(std::find(written.begin(), written.end(), png) != written.end());
      REQUIRE(fs::exists(png));
      CHECK(fs::file_size(png) > 1000);
      CHECK(is_png(png));
    }
  }
  const CliResult missing = run_shell(kPython + " " + script + " '" + dir.file("absent.json") + "'");
  CHECK(missing.status == 1);
  REQUIRE(missing.lines.size() == 1);
  CHECK_THAT(missing.lines[0], Contains("plot_trace.py: error:"));
  CHECK_THAT(missing.lines[0], Contains("absent.json: cannot read"));
  write_text(dir.file("bad.json"), "{\"schema\": ");
  const CliResult bad = run_shell(kPython + " " + script + " '" + dir.file("bad.json") + "'");
  CHECK(bad.status == 1);
  REQUIRE(bad.lines.size() == 1);
  CHECK_THAT(bad.lines[0], Contains("bad.json: not valid JSON"));
}
