// Tests of `gradscale bench step` through the built binary: the per-layer table of a tiny run (one row
// per layer, the rest of the step, the step line) and exit status 2 with one clear line for bad input.
// Only the shape of the report is checked: timings are figures to read, never asserted.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/cli_run.h"

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_cli;

namespace {

bool has_line(const CliResult& r, const std::string& start) {
  for (const std::string& line : r.lines)
    if (line.rfind(start, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("bench step prints one row per layer and the step time", "[cli][bench]") {
  const CliResult r = run_cli(
      "bench step --model mlp --data synthetic:256 --steps 2 --warmup 1 --threads 1 --format fp16 "
      "--scaler static:1024");
  REQUIRE(r.status == 0);
  CHECK(has_line(r, "gradscale bench step: model mlp, fp16, batch 128, threads 1, 2 steps after 1 warm-up"));
  for (const char* row : {"0    flatten", "1    fc1", "2    relu1", "3    fc2", "4    relu2", "5    fc3"})
    CHECK(has_line(r, row));
  CHECK(has_line(r, "layers (forward + backward)"));
  CHECK(has_line(r, "rest (weights, loss, scaler, optimizer)"));
  CHECK(has_line(r, "step: mean "));
  CHECK(has_line(r, "data: synthetic"));
}

TEST_CASE("bench rejects bad input with one line and exit 2", "[cli][bench]") {
  const CliResult steps = run_cli("bench step --data synthetic:64 --steps 0");
  CHECK(steps.status == 2);
  REQUIRE(steps.lines.size() == 1);
  CHECK_THAT(steps.lines[0], Contains("--steps must be a whole number in [1, 1000000], got '0'"));
  const CliResult what = run_cli("bench gemm");
  CHECK(what.status == 2);
  REQUIRE(what.lines.size() == 1);
  CHECK_THAT(what.lines[0], Contains("unknown benchmark 'gemm'"));
  const CliResult epochs = run_cli("bench step --data synthetic:64 --epochs 3");
  CHECK(epochs.status == 2);
  REQUIRE(epochs.lines.size() == 1);
  CHECK_THAT(epochs.lines[0], Contains("--epochs does not apply to bench step"));
  const CliResult model = run_cli("bench step --data synthetic:64 --model lenet");
  CHECK(model.status == 2);
  CHECK_THAT(model.lines.back(), Contains("lenet"));
}

TEST_CASE("bench: every numeric option has bounds, checked before any work",
          "[cli][bench]") {
  struct Case {
    const char* args;
    const char* message;
  };
  const Case cases[] = {
      {"bench numeric --elements -5", "--elements must be a whole number in [1, 1073741824], got '-5'"},
      {"bench numeric --elements 1e15", "--elements must be a whole number in [1, 1073741824], got '1e15'"},
      {"bench numeric --elements 1000000000000000", "--elements must be a whole number in [1, 1073741824]"},
      {"bench numeric --elements 99999999999999999999999", "--elements must be a whole number in [1, "},
      {"bench numeric --elements 0", "--elements must be a whole number in [1, 1073741824], got '0'"},
      {"bench cuda --elements -1", "--elements must be a whole number in [1, 1073741824], got '-1'"},
      {"bench numeric --repeats 0", "--repeats must be a whole number in [1, 1000], got '0'"},
      {"bench numeric --repeats 4294967297", "--repeats must be a whole number in [1, 1000]"},
      {"bench step --data synthetic:64 --warmup 99999999999",
       "--warmup must be a whole number in [0, 1000000], got '99999999999'"},
      {"bench step --data synthetic:64 --warmup -1",
       "--warmup must be a whole number in [0, 1000000], got '-1'"},
      {"bench step --data synthetic:64 --steps 2.5",
       "--steps must be a whole number in [1, 1000000], got '2.5'"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const CliResult r = gradscale::test::run_shell(std::string("timeout 60 \"$GS\" ") + c.args);
    CHECK(r.status == 2);
    REQUIRE(r.lines.size() == 1);
    CHECK_THAT(r.lines[0], Contains(c.message));
  }
}
