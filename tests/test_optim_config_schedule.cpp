// Tests of lib/optim's configuration and LR schedules: make_optimizer's defaults and round trip,
// configuration errors naming the key, and the constant, step and cosine schedules with warm-up.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/optim/adam.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "lib/optim/sgd.h"
#include "tests/optim_fixtures.h"

using gradscale::Adam;
using gradscale::ConfigError;
using gradscale::LrSchedule;
using gradscale::Optimizer;
using gradscale::Parameter;
using gradscale::Sgd;
using gradscale::Shape;
using gradscale::Tensor;
using nlohmann::json;
using namespace gradscale::test::optim_fixtures;

// ---------------------------------------------------------------------------------------------------
// Configuration.

TEST_CASE("make_optimizer fills PyTorch's defaults and round-trips its config", "[optim]") {
  CHECK(gradscale::make_optimizer("sgd")->config() ==
        json{{"name", "sgd"}, {"momentum", 0.0}, {"nesterov", false}, {"weight_decay", 0.0}});
  CHECK(gradscale::make_optimizer("adam")->config() ==
        json{{"name", "adam"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.0}});
  CHECK(gradscale::make_optimizer({{"name", "adamw"}})->config()["weight_decay"] == 0.01);
  for (const json& cfg : stateful_configs()) {
    const json resolved = gradscale::make_optimizer(cfg)->config();
    CHECK(gradscale::make_optimizer(resolved)->config() == resolved);
  }
}

TEST_CASE("optimizer config errors name the key and the allowed range", "[optim]") {
  using Catch::Contains;
  auto err = [](const json& cfg) {
    try {
      gradscale::make_optimizer(cfg);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err({{"name", "rmsprop"}}), Contains("'rmsprop'") && Contains("sgd, adam, adamw"));
  CHECK_THAT(err({{"momentum", 0.9}}), Contains("'name'"));
  CHECK_THAT(err({{"name", 3}}), Contains("'name'"));
  CHECK_THAT(err({{"name", "sgd"}, {"momentum", 1.0}}), Contains("'momentum'") && Contains("[0, 1)"));
  CHECK_THAT(err({{"name", "sgd"}, {"momentum", "0.9"}}), Contains("'momentum'"));
  CHECK_THAT(err({{"name", "sgd"}, {"nesterov", true}}), Contains("'nesterov'") && Contains("'momentum'"));
  CHECK_THAT(err({{"name", "sgd"}, {"nesterov", 1}}), Contains("'nesterov'") && Contains("true or false"));
  CHECK_THAT(err({{"name", "sgd"}, {"weight_decay", -1e-4}}),
             Contains("'weight_decay'") && Contains("[0, inf)"));
  CHECK_THAT(err({{"name", "sgd"}, {"lr", 0.1}}), Contains("unknown key 'lr'"));
  CHECK_THAT(err({{"name", "adam"}, {"beta1", -0.5}}), Contains("'beta1'") && Contains("[0, 1)"));
  CHECK_THAT(err({{"name", "adam"}, {"beta2", 1}}), Contains("'beta2'") && Contains("[0, 1)"));
  CHECK_THAT(err({{"name", "adam"}, {"eps", 0}}), Contains("'eps'") && Contains("(0, inf)"));
  CHECK_THAT(err({{"name", "adamw"}, {"weight_decay", -1}}), Contains("'weight_decay'"));
  CHECK_THAT(err({{"name", "adam"}, {"amsgrad", true}}),
             Contains("unknown key 'amsgrad'") && Contains("beta1"));
  CHECK_THAT(err({{"name", "adam"}, {"momentum", 0.9}}), Contains("unknown key 'momentum'"));
  CHECK_THROWS_WITH(Sgd(Sgd::Options{-0.1, false, 0.0}), Contains("'momentum'"));
  CHECK_THROWS_WITH(Adam(Adam::Options{0.9, 0.999, -1.0, 0.0, false}), Contains("'eps'"));
}

// ---------------------------------------------------------------------------------------------------
// LR schedules. Values are computed in double from the closed forms; the tolerance allows a few double
// roundings (and cos's error of about one ulp).

namespace {
Approx near(double x) {
  return Approx(x).epsilon(8 * DBL_EPSILON).margin(0.0);
}
}  // namespace

TEST_CASE("constant schedule, with and without warm-up", "[optim]") {
  const auto s = LrSchedule::from_json({{"name", "constant"}, {"lr", 0.1}});
  CHECK(s.lr(0) == 0.1);
  CHECK(s.lr(123456) == 0.1);
  const auto w = LrSchedule::from_json({{"name", "constant"}, {"lr", 0.1}, {"warmup_steps", 4}});
  CHECK(w.lr(0) == near(0.1 / 3.0));  // torch LinearLR's default start factor 1/3
  CHECK(w.lr(2) == near(0.1 * (1.0 / 3.0 + (2.0 / 3.0) * 0.5)));
  CHECK(w.lr(4) == 0.1);
  CHECK_THROWS_AS(s.lr(-1), gradscale::Error);
}

TEST_CASE("step schedule: boundaries every step_size applied steps, after the warm-up", "[optim]") {
  const auto s = LrSchedule::from_json({{"name", "step"}, {"lr", 0.1}, {"step_size", 3}, {"gamma", 0.5}});
  CHECK(s.lr(0) == 0.1);
  CHECK(s.lr(2) == 0.1);
  CHECK(s.lr(3) == 0.05);  // gamma = 1/2 scales exactly
  CHECK(s.lr(5) == 0.05);
  CHECK(s.lr(6) == 0.025);
  const auto w = LrSchedule::from_json({{"name", "step"},
                                        {"lr", 0.8},
                                        {"step_size", 3},
                                        {"gamma", 0.5},
                                        {"warmup_steps", 4},
                                        {"warmup_start_factor", 0.25}});
  CHECK(w.lr(0) == near(0.2));
  CHECK(w.lr(2) == near(0.5));
  CHECK(w.lr(3) == near(0.65));
  CHECK(w.lr(4) == 0.8);  // warm-up end: the full rate
  CHECK(w.lr(6) == 0.8);
  CHECK(w.lr(7) == 0.4);  // first boundary: warmup_steps + step_size
  CHECK(w.lr(10) == 0.2);
  CHECK(LrSchedule::from_json({{"name", "step"}, {"lr", 1.0}, {"step_size", 2}}).lr(2) == near(0.1));
}

TEST_CASE("cosine schedule: lr at the warm-up end, min_lr at total_steps and after", "[optim]") {
  const auto s = LrSchedule::from_json({{"name", "cosine"},
                                        {"lr", 1.0},
                                        {"min_lr", 0.1},
                                        {"total_steps", 10},
                                        {"warmup_steps", 2},
                                        {"warmup_start_factor", 0.5}});
  CHECK(s.lr(0) == near(0.5));
  CHECK(s.lr(1) == near(0.75));
  CHECK(s.lr(2) == 1.0);         // cos(0) = 1
  CHECK(s.lr(6) == near(0.55));  // halfway through the decay: the mean of lr and min_lr
  CHECK(s.lr(10) == 0.1);
  CHECK(s.lr(1000) == 0.1);  // stays at min_lr (torch's CosineAnnealingLR would rise again)
  for (int k = 2; k < 10; ++k) CHECK(s.lr(k + 1) < s.lr(k));
  const auto plain = LrSchedule::from_json({{"name", "cosine"}, {"lr", 0.4}, {"total_steps", 4}});
  CHECK(plain.lr(0) == 0.4);
  CHECK(plain.lr(1) == near(0.4 * (1 + std::cos(std::acos(-1.0) / 4)) / 2));
  CHECK(plain.lr(4) == 0.0);
}

TEST_CASE("schedule config: defaults, round trip and errors naming the key", "[optim]") {
  using Catch::Contains;
  const auto s = LrSchedule::from_json({{"name", "cosine"}, {"lr", 0.1}, {"total_steps", 100}});
  CHECK(s.config() == json{{"name", "cosine"},
                           {"lr", 0.1},
                           {"total_steps", 100},
                           {"min_lr", 0.0},
                           {"warmup_steps", 0},
                           {"warmup_start_factor", 1.0 / 3.0}});
  CHECK(LrSchedule::from_json(s.config()).config() == s.config());
  auto err = [](const json& cfg) {
    try {
      LrSchedule::from_json(cfg);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err({{"name", "linear"}, {"lr", 0.1}}),
             Contains("'linear'") && Contains("constant, step, cosine"));
  CHECK_THAT(err({{"name", "constant"}}), Contains("missing key 'lr'"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", -1}}), Contains("'lr'") && Contains("[0, inf)"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", 0.1}, {"total_steps", 5}}),
             Contains("unknown key 'total_steps'"));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}}), Contains("missing key 'step_size'"));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}, {"step_size", 0}}),
             Contains("'step_size'") && Contains("[1, "));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}, {"step_size", 2.5}}), Contains("'step_size'"));
  CHECK_THAT(err({{"name", "step"}, {"lr", 0.1}, {"step_size", 2}, {"gamma", 0}}),
             Contains("'gamma'") && Contains("(0, 1]"));
  CHECK_THAT(err({{"name", "cosine"}, {"lr", 0.1}, {"total_steps", 5}, {"warmup_steps", 5}}),
             Contains("'total_steps'") && Contains("'warmup_steps'"));
  CHECK_THAT(err({{"name", "cosine"}, {"lr", 0.1}, {"total_steps", 5}, {"min_lr", 0.2}}),
             Contains("'min_lr'") && Contains("[0, 0.1]"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", 0.1}, {"warmup_steps", -1}}), Contains("'warmup_steps'"));
  CHECK_THAT(err({{"name", "constant"}, {"lr", 0.1}, {"warmup_start_factor", 0}}),
             Contains("'warmup_start_factor'") && Contains("(0, 1]"));
  CHECK(LrSchedule::from_json({{"name", "step"}, {"lr", 0.1}, {"step_size", 2.0}}).options().step_size == 2);
}
