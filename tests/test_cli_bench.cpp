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
  CHECK_THAT(steps.lines[0], Contains("--steps must be >= 1"));
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
