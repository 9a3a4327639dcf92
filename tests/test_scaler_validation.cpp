// Parameter validation of every baseline policy: each bad value is refused with a ConfigError whose
// message names the parameter and the allowed range (SPEC §7: "validates its parameters with a clear
// error naming the parameter"), and unknown keys are refused with the list of allowed ones.
#include <catch2/catch.hpp>

#include <string>

#include "lib/core/error.h"
#include "lib/scaler/scaler.h"

using Catch::Matchers::Contains;

namespace {

// The ConfigError message for a scaler spec; fails the test when none is thrown.
std::string error_of(const std::string& spec) {
  try {
    gradscale::make_scaler(std::string_view(spec), gradscale::Format::fp16);
  } catch (const gradscale::ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for " << spec);
  return "";
}

}  // namespace

TEST_CASE("unknown parameters are refused with the allowed ones listed", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"torch","growth":2})"),
             Contains("scaler 'torch'") && Contains("unknown key 'growth'") &&
                 Contains("init_scale, growth_factor, backoff_factor, growth_interval"));
  CHECK_THAT(error_of(R"({"policy":"none","scale":2})"), Contains("unknown key 'scale'"));
  CHECK_THAT(error_of(R"({"policy":"static","scale":2,"min_scale":1})"), Contains("unknown key 'min_scale'"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","delayed_shift":2})"),
             Contains("unknown key 'delayed_shift'"));
  CHECK_THAT(error_of(R"({"policy":"megatron","init_scale":2})"), Contains("unknown key 'init_scale'"));
  CHECK_THAT(error_of(R"({"policy":"apex","min_loss_scale":2})"), Contains("unknown key 'min_loss_scale'"));
  CHECK_THAT(error_of(R"({"policy":"keras","dynamic_growth_steps":2})"),
             Contains("unknown key 'dynamic_growth_steps'"));
  CHECK_THAT(error_of(R"({"policy":"jmp","init_scale":2})"), Contains("unknown key 'init_scale'"));
  CHECK_THAT(error_of(R"({"policy":"cerebras","min_loss_scale":1})"),
             Contains("unknown key 'min_loss_scale'"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","binEdgeLocation":0.1})"),
             Contains("unknown key 'binEdgeLocation'"));
}

TEST_CASE("static: the scale is required, finite and positive", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"static"})"), Contains("missing key 'scale'"));
  CHECK_THAT(error_of("static:0"), Contains("'scale'") && Contains("(0, inf)"));
  CHECK_THAT(error_of("static:-2"), Contains("'scale'") && Contains("(0, inf)"));
  CHECK_THAT(error_of(R"({"policy":"static","scale":"8"})"), Contains("'scale' must be a number"));
}

TEST_CASE("torch: growth > 1, backoff in (0, 1), interval >= 1, finite positive float32 scale", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"torch","growth_factor":1})"),
             Contains("'growth_factor'") && Contains("(1, inf)"));
  CHECK_THAT(error_of(R"({"policy":"torch","growth_factor":0.5})"), Contains("'growth_factor'"));
  CHECK_THAT(error_of(R"({"policy":"torch","backoff_factor":1})"),
             Contains("'backoff_factor'") && Contains("(0, 1)"));
  CHECK_THAT(error_of(R"({"policy":"torch","backoff_factor":0})"),
             Contains("'backoff_factor'") && Contains("(0, 1)"));
  CHECK_THAT(error_of(R"({"policy":"torch","backoff_factor":1.5})"), Contains("'backoff_factor'"));
  CHECK_THAT(error_of(R"({"policy":"torch","growth_interval":0})"),
             Contains("'growth_interval'") && Contains("integer in [1, 2147483647]"));
  CHECK_THAT(error_of(R"({"policy":"torch","growth_interval":2.5})"), Contains("'growth_interval'"));
  CHECK_THAT(error_of(R"({"policy":"torch","init_scale":0})"),
             Contains("'init_scale'") && Contains("(0, inf)"));
  CHECK_THAT(error_of(R"({"policy":"torch","init_scale":-1})"), Contains("'init_scale'"));
  CHECK_THAT(error_of(R"({"policy":"torch","init_scale":1e39})"),
             Contains("'init_scale'") && Contains("as a float32") && Contains("float32: inf"));
  CHECK_THAT(error_of(R"({"policy":"torch","init_scale":1e-50})"),
             Contains("'init_scale'") && Contains("float32: 0"));
}

TEST_CASE("deepspeed: window, hysteresis, min_scale and the flags", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"deepspeed","scale_window":0})"),
             Contains("'scale_window'") && Contains("[1,"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","hysteresis":0})"),
             Contains("'hysteresis'") && Contains("[1,"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","min_scale":0})"),
             Contains("'min_scale'") && Contains("(0, inf)"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","init_scale":4,"min_scale":8})"),
             Contains("'min_scale' (8.0) must not exceed 'init_scale' (4.0)"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","consecutive_hysteresis":1})"),
             Contains("'consecutive_hysteresis' must be true or false"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","raise_at_min":"yes"})"), Contains("'raise_at_min'"));
  CHECK_THAT(error_of(R"({"policy":"deepspeed","legacy_growth":null})"), Contains("'legacy_growth'"));
}

TEST_CASE("megatron: factors, interval, hysteresis, min_scale <= initial_scale", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"megatron","growth_factor":1})"),
             Contains("'growth_factor'") && Contains("(1, inf)"));
  CHECK_THAT(error_of(R"({"policy":"megatron","backoff_factor":1})"),
             Contains("'backoff_factor'") && Contains("(0, 1)"));
  // 0.99999999 is below 1 as a double but rounds to 1 in float32, where Megatron holds it.
  CHECK_THAT(error_of(R"({"policy":"megatron","backoff_factor":0.99999999})"),
             Contains("'backoff_factor'") && Contains("as a float32"));
  CHECK_THAT(error_of(R"({"policy":"megatron","growth_interval":0})"), Contains("'growth_interval'"));
  CHECK_THAT(error_of(R"({"policy":"megatron","hysteresis":0})"), Contains("'hysteresis'"));
  CHECK_THAT(error_of(R"({"policy":"megatron","initial_scale":2,"min_scale":4})"),
             Contains("'min_scale' (4.0) must not exceed 'initial_scale' (2.0)"));
  CHECK_THAT(error_of(R"({"policy":"megatron","initial_scale":1e40})"), Contains("'initial_scale'"));
}

TEST_CASE("apex: window, bounds and their order", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"apex","scale_window":0})"), Contains("'scale_window'"));
  CHECK_THAT(error_of(R"({"policy":"apex","min_scale":0})"), Contains("'min_scale'") && Contains("(0, inf)"));
  CHECK_THAT(error_of(R"({"policy":"apex","max_scale":-1})"), Contains("'max_scale'"));
  CHECK_THAT(error_of(R"({"policy":"apex","init_scale":4,"min_scale":8})"),
             Contains("'min_scale' (8.0) must not exceed the first scale"));
  CHECK_THAT(error_of(R"({"policy":"apex","max_scale":4,"min_scale":8})"), Contains("'min_scale' (8.0)"));
  CHECK_NOTHROW(gradscale::make_scaler(R"({"policy":"apex","min_scale":null})", gradscale::Format::fp16));
}

TEST_CASE("keras: initial_scale at least the floor 1, growth_steps >= 1", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"keras","initial_scale":0.5})"),
             Contains("'initial_scale'") && Contains("[1, inf)"));
  CHECK_THAT(error_of(R"({"policy":"keras","growth_steps":0})"), Contains("'growth_steps'"));
}

TEST_CASE("jmp: period, factor, min_loss_scale <= loss_scale", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"jmp","period":0})"), Contains("'period'"));
  CHECK_THAT(error_of(R"({"policy":"jmp","factor":1})"), Contains("'factor'") && Contains("(1, inf)"));
  CHECK_THAT(error_of(R"({"policy":"jmp","min_loss_scale":0})"), Contains("'min_loss_scale'"));
  CHECK_THAT(error_of(R"({"policy":"jmp","loss_scale":2,"min_loss_scale":4})"),
             Contains("'min_loss_scale' (4.0) must not exceed 'loss_scale' (2.0)"));
}

TEST_CASE("cerebras: min_scale >= 2^-14, 0 <= tolerance < 1, bounds in order", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"cerebras","min_scale":1e-5})"),
             Contains("'min_scale' must be in [6.1") && Contains("got 1e-05"));
  CHECK_THAT(error_of(R"({"policy":"cerebras","overflow_tolerance":-0.1})"),
             Contains("'overflow_tolerance'") && Contains("[0, 1)"));
  CHECK_THAT(error_of(R"({"policy":"cerebras","overflow_tolerance":1})"), Contains("'overflow_tolerance'"));
  CHECK_THAT(error_of(R"({"policy":"cerebras","steps_per_increase":0})"), Contains("'steps_per_increase'"));
  CHECK_THAT(error_of(R"({"policy":"cerebras","max_scale":1,"min_scale":2})"), Contains("'min_scale' (2.0)"));
}

TEST_CASE("popart_als: 0 < bin_edge <= 1, 0 <= threshold <= 1, period >= 1, scales >= 1", "[scaler]") {
  CHECK_THAT(error_of(R"({"policy":"popart_als","bin_edge":0})"),
             Contains("'bin_edge'") && Contains("(0, 1]"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","bin_edge":1.5})"), Contains("'bin_edge'"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","threshold":-0.5})"),
             Contains("'threshold'") && Contains("[0, 1]"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","threshold":2})"), Contains("'threshold'"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","update_period":0})"), Contains("'update_period'"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","initial_scale":0.5})"),
             Contains("'initial_scale'") && Contains("[1, inf)"));
  CHECK_THAT(error_of(R"({"policy":"popart_als","max_scale":0.5})"), Contains("'max_scale'"));
}
