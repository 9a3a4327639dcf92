// Tests of lib/optim's state: a skipped step changes nothing, checkpoint state saved mid-run resumes
// bit-identically, state() and restoring onto other parameters or configurations, step()'s checks, and
// updates independent of the number of threads.
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

namespace {

// Two parameters as a layer has them: a decayed weight and a non-decayed bias.
struct TinyModel {
  Parameter weight =
      make_param("fc1.weight", {3, 4}, {0.5f, -1, 2, 0.25f, 1, 1.5f, -0.75f, 3, -2, 0.125f, 1, -1});
  Parameter bias = make_param("fc1.bias", {4}, {0.1f, -0.2f, 0.3f, 0}, /*decay=*/false);
  std::vector<Parameter*> params() { return {&weight, &bias}; }
  void set_grads(int step) {
    fill_grad(weight.grad, step, 0);
    fill_grad(bias.grad, step, 1);
  }
};

LrSchedule warmup_cosine() {
  return LrSchedule::from_json(
      {{"name", "cosine"}, {"lr", 0.05}, {"total_steps", 12}, {"warmup_steps", 3}, {"min_lr", 0.001}});
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Skipped steps, checkpoint state and resume.

TEST_CASE("a skipped step leaves weights, moments, step count and the schedule bit-identical", "[optim]") {
  const LrSchedule schedule = warmup_cosine();
  for (const json& cfg : stateful_configs()) {
    CAPTURE(cfg.dump());
    // Run A has an overflowing iteration after its third step; run B never sees that iteration.
    TinyModel a, b;
    auto opt_a = gradscale::make_optimizer(cfg);
    auto opt_b = gradscale::make_optimizer(cfg);
    int step_b = 0;
    for (int iteration = 0; iteration < 8; ++iteration) {
      if (iteration == 3) {
        const TinyModel before = a;
        const json state_before = opt_a->state();
        std::vector<Tensor> moments_before;
        for (const auto& st : opt_a->state_tensors()) moments_before.push_back(*st.second);
        // The overflowing iteration: non-finite gradients, found_inf, step not applied.
        a.weight.grad.fill(INFINITY);
        a.bias.grad.fill(NAN);
        CHECK(same_bits(a.weight.value, before.weight.value));
        CHECK(same_bits(a.bias.value, before.bias.value));
        CHECK(opt_a->state() == state_before);
        const auto moments_after = opt_a->state_tensors();
        REQUIRE(moments_after.size() == moments_before.size());
        for (std::size_t k = 0; k < moments_before.size(); ++k)
          CHECK(same_bits(*moments_after[k].second, moments_before[k]));
        continue;
      }
      ++step_b;
      a.set_grads(step_b);
      opt_a->step(a.params(), schedule.lr(opt_a->step_count()));
      b.set_grads(step_b);
      opt_b->step(b.params(), schedule.lr(opt_b->step_count()));
    }
    CHECK(opt_a->step_count() == 7);
    CHECK(opt_a->state() == opt_b->state());
    CHECK(same_bits(a.weight.value, b.weight.value));
    CHECK(same_bits(a.bias.value, b.bias.value));
    const auto sa = opt_a->state_tensors();
    const auto sb = opt_b->state_tensors();
    REQUIRE(sa.size() == sb.size());
    for (std::size_t k = 0; k < sa.size(); ++k) CHECK(same_bits(*sa[k].second, *sb[k].second));
  }
}

TEST_CASE("state saved mid-run as JSON + raw tensors resumes bit-identically", "[optim]") {
  const LrSchedule schedule = warmup_cosine();
  for (const json& cfg : stateful_configs()) {
    CAPTURE(cfg.dump());
    TinyModel run;
    auto opt = gradscale::make_optimizer(cfg);
    for (int step = 1; step <= 5; ++step) {
      run.set_grads(step);
      opt->step(run.params(), schedule.lr(opt->step_count()));
    }
    // The checkpoint: scalars as JSON text, tensors as raw bytes with key and shape; the model's weights.
    const std::string state_text = opt->state().dump();
    struct Blob {
      std::string key;
      Shape shape;
      std::vector<char> bytes;
    };
    std::vector<Blob> blobs;
    for (const auto& [key, tensor] : opt->state_tensors()) {
      Blob blob{key, tensor->shape(),
                std::vector<char>(static_cast<std::size_t>(tensor->size()) * sizeof(float))};
      std::memcpy(blob.bytes.data(), tensor->data(), blob.bytes.size());
      blobs.push_back(std::move(blob));
    }
    REQUIRE_FALSE(blobs.empty());
    const TinyModel saved_model = run;

    // The uninterrupted run goes on.
    for (int step = 6; step <= 10; ++step) {
      run.set_grads(step);
      opt->step(run.params(), schedule.lr(opt->step_count()));
    }

    // The resumed run: a new optimizer from the stored config, the stored state, a new model object.
    TinyModel resumed = saved_model;
    const json state = json::parse(state_text);
    auto opt2 = gradscale::make_optimizer(state.at("optimizer"));
    opt2->restore_state(state, resumed.params());
    CHECK(opt2->step_count() == 5);
    const auto tensors = opt2->state_tensors();
    REQUIRE(tensors.size() == blobs.size());
    for (std::size_t k = 0; k < blobs.size(); ++k) {
      REQUIRE(tensors[k].first == blobs[k].key);
      REQUIRE(tensors[k].second->shape() == blobs[k].shape);
      std::memcpy(tensors[k].second->data(), blobs[k].bytes.data(), blobs[k].bytes.size());
    }
    for (int step = 6; step <= 10; ++step) {
      resumed.set_grads(step);
      opt2->step(resumed.params(), schedule.lr(opt2->step_count()));
    }
    CHECK(same_bits(resumed.weight.value, run.weight.value));
    CHECK(same_bits(resumed.bias.value, run.bias.value));
    CHECK(opt2->state() == opt->state());
    const auto s1 = opt->state_tensors();
    const auto s2 = opt2->state_tensors();
    for (std::size_t k = 0; k < s1.size(); ++k) CHECK(same_bits(*s1[k].second, *s2[k].second));

    // Without the restored state (same weights and learning rates, fresh moments and step count) the
    // continuation differs: the comparison above can see a lost moment.
    TinyModel fresh = saved_model;
    auto opt3 = gradscale::make_optimizer(cfg);
    for (int step = 6; step <= 10; ++step) {
      fresh.set_grads(step);
      opt3->step(fresh.params(), schedule.lr(5 + opt3->step_count()));
    }
    CHECK_FALSE(same_bits(fresh.weight.value, run.weight.value));
  }
}

TEST_CASE("state() lists the hyperparameters, the step count and the bound parameters", "[optim]") {
  auto opt = gradscale::make_optimizer({{"name", "adam"}, {"beta1", 0.85}});
  TinyModel model;
  CHECK(opt->state()["step"] == 0);
  CHECK(opt->state()["parameters"].empty());
  CHECK(opt->state_tensors().empty());
  model.set_grads(1);
  opt->step(model.params(), 1e-3);
  const json s = opt->state();
  CHECK(s["step"] == 1);
  CHECK(s["optimizer"]["beta1"] == 0.85);
  CHECK(s["optimizer"]["eps"] == 1e-8);
  CHECK(s["parameters"] ==
        json::array({{{"name", "fc1.weight"}, {"shape", {3, 4}}}, {{"name", "fc1.bias"}, {"shape", {4}}}}));
  std::vector<std::string> keys;
  for (const auto& st : opt->state_tensors()) keys.push_back(st.first);
  CHECK(keys == std::vector<std::string>{"fc1.weight/exp_avg", "fc1.weight/exp_avg_sq", "fc1.bias/exp_avg",
                                         "fc1.bias/exp_avg_sq"});
  // The tensors are owned by the optimizer and stay where they are across steps.
  const Tensor* first = opt->state_tensors()[0].second;
  model.set_grads(2);
  opt->step(model.params(), 1e-3);
  CHECK(opt->state_tensors()[0].second == first);
}

TEST_CASE("restoring onto other parameters or another configuration names what differs", "[optim]") {
  TinyModel model;
  auto opt = gradscale::make_optimizer({{"name", "sgd"}, {"momentum", 0.9}});
  model.set_grads(1);
  opt->step(model.params(), 0.1);
  const json state = opt->state();

  auto fresh = [] { return gradscale::make_optimizer({{"name", "sgd"}, {"momentum", 0.9}}); };
  {
    TinyModel other;
    other.bias.name = "fc2.bias";
    CHECK_THROWS_AS(fresh()->restore_state(state, other.params()), ConfigError);
    CHECK_THROWS_WITH(fresh()->restore_state(state, other.params()), Catch::Contains("'fc2.bias'"));
  }
  {
    TinyModel other;
    other.weight = make_param("fc1.weight", {4, 3}, std::vector<float>(12, 0.0f));
    CHECK_THROWS_WITH(fresh()->restore_state(state, other.params()), Catch::Contains("'fc1.weight'") &&
                                                                         Catch::Contains("[3, 4]") &&
                                                                         Catch::Contains("[4, 3]"));
  }
  {
    TinyModel other;
    Parameter extra = make_param("fc2.weight", {2}, {0, 0});
    CHECK_THROWS_WITH(fresh()->restore_state(state, {&other.weight, &other.bias, &extra}),
                      Catch::Contains("'fc2.weight'") && Catch::Contains("not in the checkpoint"));
    CHECK_THROWS_WITH(fresh()->restore_state(state, {&other.weight}),
                      Catch::Contains("'fc1.bias'") && Catch::Contains("not in the model"));
  }
  {
    auto other = gradscale::make_optimizer({{"name", "sgd"}, {"momentum", 0.8}});
    CHECK_THROWS_WITH(other->restore_state(state, model.params()), Catch::Contains("'momentum'"));
    auto adam = gradscale::make_optimizer("adam");
    CHECK_THROWS_WITH(adam->restore_state(state, model.params()),
                      Catch::Contains("\"sgd\"") && Catch::Contains("'adam'"));
  }
  {
    json broken = state;
    broken.erase("step");
    CHECK_THROWS_WITH(fresh()->restore_state(broken, model.params()), Catch::Contains("'step'"));
    json corrupt = state;
    corrupt["parameters"][1]["shape"] = json::array({"4"});
    CHECK_THROWS_AS(fresh()->restore_state(corrupt, model.params()), ConfigError);
    CHECK_THROWS_WITH(fresh()->restore_state(corrupt, model.params()),
                      Catch::Contains("'fc1.bias'") && Catch::Contains("'shape'"));
  }
  // A failed restore leaves the optimizer as it was.
  auto target = fresh();
  TinyModel other;
  other.bias.name = "fc2.bias";
  CHECK_THROWS(target->restore_state(state, other.params()));
  CHECK(target->step_count() == 0);
  CHECK(target->state_tensors().empty());
}

TEST_CASE("step() checks its parameters and changes nothing when it throws", "[optim]") {
  auto opt = gradscale::make_optimizer({{"name", "adam"}});
  TinyModel model;
  model.set_grads(1);
  CHECK_THROWS_AS(opt->step(model.params(), -0.1), ConfigError);
  CHECK_THROWS_AS(opt->step(model.params(), NAN), ConfigError);
  CHECK(opt->step_count() == 0);

  opt->step(model.params(), 1e-3);
  const TinyModel before = model;
  model.bias.grad = Tensor({5});
  CHECK_THROWS_AS(opt->step(model.params(), 1e-3), gradscale::ShapeError);
  CHECK_THROWS_WITH(opt->step(model.params(), 1e-3), Catch::Contains("'fc1.bias'"));
  CHECK(same_bits(model.weight.value, before.weight.value));  // the valid first parameter was not touched
  CHECK(opt->step_count() == 1);

  model.bias.grad = Tensor({4});
  Parameter renamed = model.bias;
  renamed.name = "fc9.bias";
  CHECK_THROWS_WITH(opt->step({&model.weight, &renamed}, 1e-3), Catch::Contains("'fc9.bias'"));
  CHECK_THROWS_WITH(opt->step({&model.weight}, 1e-3), Catch::Contains("1 parameters"));
  CHECK(opt->step_count() == 1);
}

TEST_CASE("updates do not depend on the number of threads", "[optim]") {
  const int saved_threads = omp_get_max_threads();
  for (const json& cfg : stateful_configs()) {
    CAPTURE(cfg.dump());
    std::vector<Tensor> results;
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const std::int64_t n = 200003;  // above the parallel threshold, not a multiple of the thread count
      Parameter p = make_param("w", {n}, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
      fill_grad(p.value, 0, 3);
      auto opt = gradscale::make_optimizer(cfg);
      for (int step = 1; step <= 3; ++step) {
        fill_grad(p.grad, step, 0);
        opt->step({&p}, 0.01);
      }
      results.push_back(p.value);
    }
    CHECK(same_bits(results[0], results[1]));
    CHECK(same_bits(results[0], results[2]));
  }
  omp_set_num_threads(saved_threads);
}
