// Tests of the scaler interface and registry (lib/scaler) and of properties every baseline policy
// shares: spec parsing and its errors, the registry, config round trips, and state save/restore in the
// middle of an interval continuing bit-identically. Hand-worked sequences per policy are in
// test_scaler_sequences.cpp, parameter validation in test_scaler_validation.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/scaler/scaler.h"

using Catch::Matchers::Contains;
using gradscale::ConfigError;
using gradscale::Format;
using gradscale::Scaler;
using gradscale::StepReport;
using gradscale::StepStatistics;
using nlohmann::json;

namespace {

std::unique_ptr<Scaler> make(const std::string& spec, Format f = Format::fp16) {
  return gradscale::make_scaler(std::string_view(spec), f);
}

std::string config_error_of_spec(const std::string& spec) {
  try {
    gradscale::parse_scaler_spec(spec);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for spec " << spec);
  return "";
}

std::string config_error_of_make(const json& config) {
  try {
    gradscale::make_scaler(config, Format::fp16);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for config " << config.dump());
  return "";
}

// Deterministic pseudo-random step statistics: about one overflow in five steps, and counts about the
// edge that make popart_als move both ways.
struct StepSource {
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  StepStatistics next() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const std::uint64_t r = x >> 33;
    StepStatistics s;
    s.found_inf = r % 5 == 0;
    s.grad_below_edge = 1000 + r % 97;
    s.grad_above_edge = (r / 7) % 3 == 0 ? (r / 11) % 2 : 0;
    return s;
  }
};

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Every built-in policy with parameters small enough that growth, backoff and the counters all move
// within a few dozen steps.
const std::vector<std::string>& policy_specs() {
  static const std::vector<std::string> specs = {
      R"({"policy":"none"})",
      R"({"policy":"static","scale":1024})",
      R"({"policy":"torch","init_scale":1024,"growth_interval":3,"growth_factor":1.5,"backoff_factor":0.3})",
      R"({"policy":"deepspeed","init_scale":1024,"scale_window":3,"min_scale":0.5,"raise_at_min":false})",
      R"({"policy":"deepspeed","init_scale":1024,"scale_window":2,"consecutive_hysteresis":true,"hysteresis":3,"raise_at_min":false})",
      R"({"policy":"deepspeed","init_scale":1024,"scale_window":4,"legacy_growth":true,"raise_at_min":false})",
      R"({"policy":"megatron","initial_scale":1024,"growth_interval":3,"hysteresis":2,"backoff_factor":0.3})",
      R"({"policy":"apex","init_scale":1024,"scale_window":3,"max_scale":4096,"min_scale":1})",
      R"({"policy":"keras","initial_scale":1024,"growth_steps":3})",
      R"({"policy":"jmp","loss_scale":1024,"period":3,"factor":3})",
      R"({"policy":"cerebras","init_scale":1024,"steps_per_increase":3,"overflow_tolerance":0.25})",
      R"({"policy":"popart_als","initial_scale":64,"update_period":2,"threshold":0.0005})",
  };
  return specs;
}

}  // namespace

TEST_CASE("parse_scaler_spec accepts a JSON object, a policy name and static:S", "[scaler]") {
  CHECK(gradscale::parse_scaler_spec("torch") == json{{"policy", "torch"}});
  CHECK(gradscale::parse_scaler_spec("  popart_als\n") == json{{"policy", "popart_als"}});
  CHECK(gradscale::parse_scaler_spec("static:8") == json{{"policy", "static"}, {"scale", 8.0}});
  CHECK(gradscale::parse_scaler_spec("static:0x1p-3") == json{{"policy", "static"}, {"scale", 0.125}});
  const json j = gradscale::parse_scaler_spec(R"({"policy":"torch","init_scale":4})");
  CHECK(j == json{{"policy", "torch"}, {"init_scale", 4}});
  // The static form builds a working scaler.
  CHECK(make("static:8")->loss_scale() == 8.0);
  CHECK(make("torch")->loss_scale() == 65536.0);
}

TEST_CASE("parse_scaler_spec rejects malformed specs with a clear message", "[scaler]") {
  CHECK_THAT(config_error_of_spec(""), Contains("empty scaler spec"));
  const std::string bad_json = config_error_of_spec(R"({"policy":"torch",)");
  CHECK_THAT(bad_json, Contains("not valid JSON") && Contains("parse error"));
  CHECK_THAT(config_error_of_spec("[1,2]"), Contains("is an object"));
  CHECK_THAT(config_error_of_spec("nope"),
             Contains("unknown scaler policy 'nope'") && Contains("torch") && Contains("popart_als"));
  CHECK_THAT(config_error_of_spec("to rch"), Contains("not a JSON object, a policy name or static:S"));
  CHECK_THAT(config_error_of_spec("torch:3"), Contains("only static takes a value"));
  CHECK_THAT(config_error_of_spec("static:"), Contains("not a finite number"));
  CHECK_THAT(config_error_of_spec("static:abc"), Contains("'abc' is not a finite number"));
  CHECK_THAT(config_error_of_spec("static:inf"), Contains("not a finite number"));
}

TEST_CASE("make_scaler names unknown policies and malformed configurations", "[scaler]") {
  CHECK_THAT(config_error_of_make(json{{"policy", "pytorch"}}),
             Contains("unknown scaler policy 'pytorch'") && Contains("known: apex, cerebras, deepspeed"));
  CHECK_THAT(config_error_of_make(json{{"init_scale", 4}}), Contains("has no \"policy\""));
  CHECK_THAT(config_error_of_make(json{{"policy", 3}}), Contains("\"policy\" must be a string"));
  CHECK_THAT(config_error_of_make(json::array({1})), Contains("is a JSON object"));
}

TEST_CASE("the registry lists every built-in policy, sorted, and takes new ones", "[scaler]") {
  const std::vector<std::string> names = gradscale::scaler_policies();
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const char* p :
       {"none", "static", "torch", "deepspeed", "megatron", "apex", "keras", "jmp", "cerebras", "popart_als"})
    CHECK(std::count(names.begin(), names.end(), p) == 1);

  gradscale::register_scaler("test_registry_fixed", [](const json& config, Format format) {
    json c = config;
    c["policy"] = "static";
    return gradscale::make_scaler(c, format);
  });
  CHECK(make(R"({"policy":"test_registry_fixed","scale":4})")->loss_scale() == 4.0);
  // A bare name reaches the new factory (which then misses its parameter), not "unknown policy".
  CHECK_THROWS_WITH(make("test_registry_fixed"), Contains("'scale'") && Contains("missing"));
  CHECK_THAT(gradscale::scaler_policies(),
             Catch::Matchers::VectorContains(std::string("test_registry_fixed")));

  const auto factory = [](const json&, Format) { return std::unique_ptr<Scaler>(); };
  CHECK_THROWS_WITH(gradscale::register_scaler("torch", factory), Contains("already registered"));
  CHECK_THROWS_WITH(gradscale::register_scaler("Bad Name", factory), Contains("[a-z0-9_]+"));
  CHECK_THROWS_WITH(gradscale::register_scaler("test_registry_null", nullptr), Contains("no factory"));
  // A factory that returns nothing is caught at make_scaler.
  gradscale::register_scaler("test_registry_empty", factory);
  CHECK_THROWS_WITH(make("test_registry_empty"), Contains("returned no scaler"));
}

TEST_CASE("global policies scale only at the loss, only popart_als asks for edge counts", "[scaler]") {
  gradscale::LocalScaleQuery query;
  query.scale_in = 1024.0;
  for (const std::string& spec : policy_specs()) {
    INFO(spec);
    const auto s = make(spec);
    // What the engine applies at a layer: the controller's s, or 1 without a controller.
    const double s_layer = s->layer_controller() ? s->layer_controller()->decide(query).s : 1.0;
    CHECK(s_layer == 1.0);
    const bool statistics = s->policy() == "popart_als";
    CHECK((s->gradient_edge() > 0) == statistics);
  }
}

TEST_CASE("config() is the resolved configuration and rebuilds the same scaler", "[scaler]") {
  for (const std::string& spec : policy_specs()) {
    INFO(spec);
    const auto a = make(spec);
    const json config = a->config();
    CHECK(config.at("policy") == a->policy());
    const auto b = gradscale::make_scaler(json::parse(config.dump()), Format::fp16);
    CHECK(b->config() == config);
    CHECK(b->state() == a->state());
    CHECK(same_bits(b->loss_scale(), a->loss_scale()));
  }
  // Defaults are filled in.
  CHECK(make("torch")->config() == json{{"policy", "torch"},
                                        {"init_scale", 65536.0},
                                        {"growth_factor", 2.0},
                                        {"backoff_factor", 0.5},
                                        {"growth_interval", 2000}});
  CHECK(make("deepspeed")->config() == json{{"policy", "deepspeed"},
                                            {"init_scale", 65536.0},
                                            {"scale_window", 1000},
                                            {"min_scale", 1.0},
                                            {"hysteresis", 2},
                                            {"consecutive_hysteresis", false},
                                            {"raise_at_min", true},
                                            {"legacy_growth", false}});
  CHECK(make("megatron")->config() == json{{"policy", "megatron"},
                                           {"initial_scale", 4294967296.0},
                                           {"min_scale", 1.0},
                                           {"growth_factor", 2.0},
                                           {"backoff_factor", 0.5},
                                           {"growth_interval", 1000},
                                           {"hysteresis", 2}});
  CHECK(make("apex")->config() == json{{"policy", "apex"},
                                       {"init_scale", 65536.0},
                                       {"scale_window", 2000},
                                       {"min_scale", nullptr},
                                       {"max_scale", 16777216.0}});
  CHECK(make("keras")->config() ==
        json{{"policy", "keras"}, {"initial_scale", 32768.0}, {"growth_steps", 2000}});
  CHECK(make("jmp")->config() == json{{"policy", "jmp"},
                                      {"loss_scale", 32768.0},
                                      {"period", 2000},
                                      {"factor", 2.0},
                                      {"min_loss_scale", 1.0}});
  CHECK(make("cerebras")->config() == json{{"policy", "cerebras"},
                                           {"init_scale", 32768.0},
                                           {"steps_per_increase", 2000},
                                           {"min_scale", 0x1p-14},
                                           {"max_scale", 32768.0},
                                           {"overflow_tolerance", 0.0}});
  CHECK(make("popart_als")->config() == json{{"policy", "popart_als"},
                                             {"initial_scale", 1.0},
                                             {"bin_edge", 0.0625},
                                             {"threshold", static_cast<double>(1e-7f)},
                                             {"update_period", 1},
                                             {"max_scale", 32768.0}});
}

TEST_CASE("state saved in the middle of an interval resumes bit-identically", "[scaler]") {
  for (const std::string& spec : policy_specs()) {
    for (const int k : {0, 1, 2, 5, 13}) {
      INFO(spec << " saved after " << k << " steps");
      StepSource source;
      const auto a = make(spec);
      for (int i = 0; i < k; ++i) a->update(source.next());
      // Through text, as a checkpoint stores it.
      const std::string saved = a->state().dump();
      const auto b = make(spec);
      b->restore_state(json::parse(saved));
      CHECK(b->state() == a->state());
      CHECK(same_bits(b->loss_scale(), a->loss_scale()));
      int changes = 0;
      for (int i = 0; i < 60; ++i) {
        const StepStatistics stats = source.next();
        const double before = a->loss_scale();
        const StepReport ra = a->update(stats);
        const StepReport rb = b->update(stats);
        CHECK(ra.skipped == rb.skipped);
        CHECK(ra.skipped == stats.found_inf);
        CHECK(same_bits(ra.scale, rb.scale));
        CHECK(same_bits(ra.scale, a->loss_scale()));
        CHECK(ra.state == rb.state);
        CHECK(ra.state == a->state());
        changes += ra.scale != before ? 1 : 0;
      }
      // The sequence exercises the policy (none and static never change).
      if (a->policy() != "none" && a->policy() != "static") CHECK(changes >= 4);
    }
  }
}

TEST_CASE("restore_state rejects a state this policy cannot have written", "[scaler]") {
  const auto torch = make(R"({"policy":"torch","growth_interval":4})");
  CHECK_NOTHROW(torch->restore_state(json{{"scale", 8.0}, {"growth_tracker", 3}}));
  CHECK(torch->loss_scale() == 8.0);
  CHECK_THROWS_WITH(torch->restore_state(json{{"scale", 8.0}}), Contains("missing key 'growth_tracker'"));
  CHECK_THROWS_WITH(torch->restore_state(json{{"scale", 8.0}, {"growth_tracker", 0}, {"cur_iter", 1}}),
                    Contains("unknown key 'cur_iter'"));
  CHECK_THROWS_WITH(torch->restore_state(json{{"scale", 8.0}, {"growth_tracker", 4}}),
                    Contains("'growth_tracker'") && Contains("[0, 3]"));
  CHECK_THROWS_WITH(torch->restore_state(json{{"scale", 0.1}, {"growth_tracker", 0}}),
                    Contains("'scale' must be a float32 value"));
  CHECK_THROWS_WITH(torch->restore_state(json{{"scale", -1.0}, {"growth_tracker", 0}}), Contains("'scale'"));
  // A failed restore leaves the state as it was.
  CHECK(torch->state() == json{{"scale", 8.0}, {"growth_tracker", 3}});
  // Another policy's state is refused.
  const auto deepspeed = make("deepspeed");
  CHECK_THROWS_AS(torch->restore_state(deepspeed->state()), ConfigError);
  CHECK_THROWS_AS(make("none")->restore_state(json{{"scale", 1.0}}), ConfigError);
  CHECK_THROWS_WITH(
      make("deepspeed")
          ->restore_state(
              json{{"cur_scale", 1024.0}, {"cur_iter", 3}, {"last_overflow_iter", 3}, {"cur_hysteresis", 2}}),
      Contains("'last_overflow_iter'"));
}
