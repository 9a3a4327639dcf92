// scripts/ncu_summary.py, which turns Nsight Compute's raw CSV into the per-kernel table of a GPU run
// (docs/gpu.md): here on a hand-written CSV of that form (tests/data/ncu_raw.csv: the program's output
// around the table, a units row, a thousands separator, namespaced and templated kernel names).
#include <catch2/catch.hpp>

#include <string>

#include "tests/script_run.h"

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_script;
using gradscale::test::test_data;

TEST_CASE("ncu_summary.py groups launches by kernel, largest total first, in milliseconds", "[scripts]") {
  const CliResult r = run_script("ncu_summary.py", test_data("ncu_raw.csv"));
  REQUIRE(r.status == 0);
  REQUIRE(r.lines.size() == 5);
  CHECK(r.lines[0] == "ncu_summary: 4 launches of 3 kernels, 1.300 ms of device time");
  // 1,015.00 µs (the separator read), 120.50 + 119.50 µs over two launches, 45.25 µs.
  CHECK_THAT(r.lines[2], Contains("quantize_kernel ") && Contains(" 1 ") && Contains("1.015") && Contains("78.1%"));
  CHECK_THAT(r.lines[3], Contains("im2col_kernel ") && Contains(" 2 ") && Contains("0.240") && Contains("120.00") &&
                             Contains("18.5%"));
  CHECK_THAT(r.lines[4], Contains("sm90_xmma_gemm_f16f16") && Contains("0.045") && Contains("3.5%"));
  const CliResult top = run_script("ncu_summary.py", test_data("ncu_raw.csv") + " --top 1");
  REQUIRE(top.status == 0);
  REQUIRE(top.lines.size() == 4);
  CHECK_THAT(top.lines[3], Contains("(2 more kernels)") && Contains("0.285"));
}

TEST_CASE("ncu_summary.py names what is wrong with its input", "[scripts]") {
  const CliResult no_table = run_script("ncu_summary.py", test_data("trace_small.json"));
  CHECK(no_table.status == 2);
  REQUIRE(no_table.lines.size() == 1);
  CHECK_THAT(no_table.lines[0], Contains("ncu_summary.py: error:") && Contains("no ncu CSV header"));
  const CliResult missing = run_script("ncu_summary.py", "/nonexistent/ncu.csv");
  CHECK(missing.status == 2);
  REQUIRE(missing.lines.size() == 1);
  CHECK_THAT(missing.lines[0], Contains("cannot read '/nonexistent/ncu.csv'"));
  const CliResult top = run_script("ncu_summary.py", test_data("ncu_raw.csv") + " --top 0");
  CHECK(top.status == 2);
  CHECK_THAT(top.lines.at(0), Contains("--top must be at least 1"));
}
