// scripts/kernel_registers.py, which turns ptxas's report into the registers-and-occupancy table of
// docs/gpu.md: here on a saved report (tests/data/ptxas_report.txt: two architectures, a kernel with
// spills, one without shared memory, one whose shared memory limits its blocks), so no nvcc is needed.
#include <catch2/catch.hpp>

#include <string>

#include "tests/script_run.h"

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_script;
using gradscale::test::test_data;

namespace {

const std::string kReport = "--report " + test_data("ptxas_report.txt");

}  // namespace

TEST_CASE("kernel_registers.py reads ptxas's report and gives each kernel its blocks per SM", "[scripts]") {
  const CliResult r = run_script("kernel_registers.py", kReport);
  REQUIRE(r.status == 0);
  REQUIRE(r.lines.size() == 7);  // the architecture, a blank line, the header, its rule, three kernels
  CHECK(r.lines[0] == "sm_90, 256 threads per block");
  // 48 registers: a warp takes 1 536 of the 65 536, a block 12 288: 5 blocks. The spills as reported.
  CHECK(r.lines[4] == "| ptxas_report.txt | `stats_kernel<true>` | 48 | 4 / 8 | 16 | 9824 | 5 | 1280 |");
  // 24 registers: the 2 048 threads an SM holds, 8 blocks.
  CHECK(r.lines[5] == "| ptxas_report.txt | `copy_kernel` | 24 | 0 / 0 | 0 | 0 | 8 | 2048 |");
  // 60 000 bytes of shared memory (and 1 KiB reserved per block) in 228 KiB: 3 blocks.
  CHECK(r.lines[6] == "| ptxas_report.txt | `big_kernel` | 30 | 0 / 0 | 0 | 60000 | 3 | 768 |");
  // sm_80's entries only, at 128 threads a block: 16 blocks of 26 registers fill the 2 048 threads.
  const CliResult a100 = run_script("kernel_registers.py", kReport + " --arch 80 --block 128");
  REQUIRE(a100.status == 0);
  REQUIRE(a100.lines.size() == 5);
  CHECK(a100.lines[4] == "| ptxas_report.txt | `copy_kernel` | 26 | 0 / 0 | 0 | 0 | 16 | 2048 |");
  const CliResult only = run_script("kernel_registers.py", kReport + " --only big");
  REQUIRE(only.status == 0);
  REQUIRE(only.lines.size() == 5);
  CHECK_THAT(only.lines[4], Contains("`big_kernel`"));
}

TEST_CASE("kernel_registers.py names what is wrong with its input", "[scripts]") {
  const CliResult missing = run_script("kernel_registers.py", "--report /nonexistent/report.txt");
  CHECK(missing.status == 2);
  REQUIRE(missing.lines.size() == 1);
  CHECK_THAT(missing.lines[0], Contains("cannot read '/nonexistent/report.txt'"));
  const CliResult no_kernel = run_script("kernel_registers.py", "--report " + test_data("trace_small.json"));
  CHECK(no_kernel.status == 2);
  CHECK_THAT(no_kernel.lines.at(0), Contains("reports no kernel compiled for sm_90"));
  const CliResult block = run_script("kernel_registers.py", kReport + " --block 0");
  CHECK(block.status == 2);
  CHECK_THAT(block.lines.at(0), Contains("--block 0: a block has 1 to 1024 threads"));
  const CliResult no_build = run_script("kernel_registers.py", "--build /nonexistent/build");
  CHECK(no_build.status == 2);
  CHECK_THAT(no_build.lines.at(0), Contains("/nonexistent/build/compile_commands.json not found"));
}
