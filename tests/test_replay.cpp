// Tests of `gradscale replay` through the built binary (GRADSCALE_CLI): the exact JSON lines of
// docs/cli.md's torch example and of a few hand-worked sequences, the deepspeed raise, the popart_als
// statistics syntax, and exit status 2 with one clear line for bad input.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/cli_run.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

using Result = gradscale::test::CliResult;

std::string quote(const std::string& s) {
  return "'" + s + "'";
}  // no argument here contains a quote

Result replay(const std::string& arguments) {
  return gradscale::test::run_cli("replay " + arguments);
}

}  // namespace

TEST_CASE("replay prints a torch sequence of growth and back-off exactly", "[replay]") {
  const Result r = replay(
      "--scaler " + quote(R"({"policy":"torch","init_scale":4,"growth_interval":2,"backoff_factor":0.25})") +
      " --events FFI");
  CHECK(r.status == 0);
  CHECK(
      r.lines ==
      std::vector<std::string>{
          R"({"step":1,"found_inf":false,"skipped":false,"scale":4.0,"state":{"growth_tracker":1,"scale":4.0}})",
          R"({"step":2,"found_inf":false,"skipped":false,"scale":8.0,"state":{"growth_tracker":0,"scale":8.0}})",
          R"({"step":3,"found_inf":true,"skipped":true,"scale":2.0,"state":{"growth_tracker":0,"scale":2.0}})",
      });
}

TEST_CASE("replay: repeat counts, bare policy names and static:S", "[replay]") {
  const Result r = replay("--scaler torch --events '1999F F'");
  CHECK(r.status == 0);
  REQUIRE(r.lines.size() == 2000);
  CHECK(
      r.lines[1998] ==
      R"({"step":1999,"found_inf":false,"skipped":false,"scale":65536.0,"state":{"growth_tracker":1999,"scale":65536.0}})");
  CHECK(
      r.lines[1999] ==
      R"({"step":2000,"found_inf":false,"skipped":false,"scale":131072.0,"state":{"growth_tracker":0,"scale":131072.0}})");

  const Result s = replay("--scaler static:8 --events 'F,I'");
  CHECK(s.status == 0);
  CHECK(s.lines ==
        std::vector<std::string>{R"({"step":1,"found_inf":false,"skipped":false,"scale":8.0,"state":{}})",
                                 R"({"step":2,"found_inf":true,"skipped":true,"scale":8.0,"state":{}})"});
}

TEST_CASE("replay: deepspeed hysteresis, and the raise at the minimum exits 1", "[replay]") {
  const Result h = replay(
      "--scaler " + quote(R"({"policy":"deepspeed","init_scale":1024,"scale_window":2})") + " --events IFI");
  CHECK(h.status == 0);
  CHECK(
      h.lines ==
      std::vector<std::string>{
          R"({"step":1,"found_inf":true,"skipped":true,"scale":1024.0,"state":{"cur_hysteresis":1,"cur_iter":1,"cur_scale":1024.0,"last_overflow_iter":0}})",
          R"({"step":2,"found_inf":false,"skipped":false,"scale":1024.0,"state":{"cur_hysteresis":1,"cur_iter":2,"cur_scale":1024.0,"last_overflow_iter":0}})",
          R"({"step":3,"found_inf":true,"skipped":true,"scale":512.0,"state":{"cur_hysteresis":1,"cur_iter":3,"cur_scale":512.0,"last_overflow_iter":2}})",
      });

  const Result r = replay("--scaler " + quote(R"({"policy":"deepspeed","init_scale":2,"hysteresis":1})") +
                          " --events III");
  CHECK(r.status == 1);
  CHECK(
      r.lines ==
      std::vector<std::string>{
          R"({"step":1,"found_inf":true,"skipped":true,"scale":1.0,"state":{"cur_hysteresis":1,"cur_iter":1,"cur_scale":1.0,"last_overflow_iter":0}})",
          R"x({"step":2,"error":"deepspeed: current loss scale already at minimum (1.0) - cannot decrease scale anymore (raise_at_min)"})x",
      });
}

TEST_CASE("replay: popart_als takes counts about the edge", "[replay]") {
  const Result r = replay("--scaler " + quote(R"({"policy":"popart_als","initial_scale":1024})") +
                          " --events '1000:0 1000:1 2*0:0 I999:1'");
  CHECK(r.status == 0);
  CHECK(
      r.lines ==
      std::vector<std::string>{
          R"({"step":1,"below":1000,"above":0,"found_inf":false,"skipped":false,"scale":2048.0,"state":{"counter":0,"loss_scale_update_factor":2.0}})",
          R"({"step":2,"below":1000,"above":1,"found_inf":false,"skipped":false,"scale":1024.0,"state":{"counter":0,"loss_scale_update_factor":1.0}})",
          R"({"step":3,"below":0,"above":0,"found_inf":false,"skipped":false,"scale":2048.0,"state":{"counter":0,"loss_scale_update_factor":2.0}})",
          R"({"step":4,"below":0,"above":0,"found_inf":false,"skipped":false,"scale":4096.0,"state":{"counter":0,"loss_scale_update_factor":4.0}})",
          R"({"step":5,"below":999,"above":1,"found_inf":true,"skipped":true,"scale":2048.0,"state":{"counter":0,"loss_scale_update_factor":2.0}})",
      });
}

TEST_CASE("replay: a float32 scale past its range is printed as \"inf\"", "[replay]") {
  const Result r =
      replay("--scaler " +
             quote(R"({"policy":"megatron","initial_scale":1.7014118346046923e38,"growth_interval":1})") +
             " --events F");
  CHECK(r.status == 0);
  CHECK(
      r.lines ==
      std::vector<std::string>{
          R"({"step":1,"found_inf":false,"skipped":false,"scale":"inf","state":{"growth_tracker":0,"hysteresis_tracker":2,"scale":"inf"}})"});
}

TEST_CASE("replay: bad input gives one error line and exit status 2", "[replay]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--scaler " + quote(R"({"policy":"torch",)") + " --events F", "scaler spec is not valid JSON"},
      {"--scaler pytorch --events F", "unknown scaler policy 'pytorch' (known: apex,"},
      {"--scaler " + quote(R"({"policy":"torch","backoff_factor":2})") + " --events F", "'backoff_factor'"},
      {"--scaler torch --events FXF", "expected F or I"},
      {"--scaler torch --events 1000:0", "expected F or I"},
      {"--scaler torch --events ' , '", "no events"},
      {"--scaler torch --events 0F", "at least 1"},
      {"--scaler popart_als --events FFI", "bad statistics event 'FFI'"},
      {"--scaler popart_als --events 1000:x", "bad number in '1000:x'"},
      {"--scaler torch --events F --format fp12", "unknown format 'fp12'"},
      {"--scaler torch", "'--events' is required"},
      {"--scaler torch --events F --bogus 1", "unrecognised option '--bogus'"},
  };
  for (const auto& [arguments, message] : cases) {
    INFO(arguments);
    const Result r = replay(arguments);
    CHECK(r.status == 2);
    REQUIRE(r.lines.size() == 1);
    CHECK_THAT(r.lines[0], StartsWith("gradscale replay: ") && Contains(message));
  }
}

TEST_CASE("replay --help describes the event syntax", "[replay]") {
  const Result r = replay("--help");
  CHECK(r.status == 0);
  std::string all;
  for (const auto& l : r.lines) all += l + "\n";
  CHECK_THAT(all,
             Contains("--scaler") && Contains("--events") && Contains("[N*][I]L:U") && Contains("1999F I"));
}
