// Data-parallel training without MPI (lib/dist): the reductions and ScaledTraining::distribute on two
// ranks that are two threads of this process, configs or files that differ between ranks, and the
// local communicator of one process.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/dist/communicator.h"
#include "lib/dist/data_parallel.h"
#include "lib/model/spec.h"
#include "lib/optim/optimizer.h"
#include "lib/train/scaled_training.h"
#include "lib/train/trainer.h"
#include "tests/cli_run.h"
#include "tests/idx_dir.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"
#include "tests/thread_ranks.h"

namespace {

using json = nlohmann::json;
using gradscale::test::on_two_ranks;
using gradscale::testing::TempDir;
using gradscale::test::run_shell;

// Values over many binades, with zeros, subnormal-range and large ones, and a NaN in one half.
std::vector<float> test_values(std::size_t n) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i % 17 == 0 ? 0.0f : std::ldexp(normal(gen), exponent(gen));
  return v;
}

}  // namespace

TEST_CASE("two ranks (threads): a reduced statistic is the whole tensor's", "[dist]") {
  using namespace gradscale;
  const std::vector<float> v = test_values(10000);
  const std::size_t half = 4321;  // uneven halves
  const TensorStats whole = tensor_stats(v.data(), v.size(), Format::fp16, RoundOptions{});
  const LogMoments whole_log = log_abs_moments(v.data(), v.size());
  TensorStats parts[2];
  LogMoments logs[2];
  std::vector<double> maxima[2];
  on_two_ranks([&](int r, Communicator& comm) {
    DataParallel dp(comm);
    const float* begin = v.data() + (r == 0 ? 0 : half);
    const std::size_t n = r == 0 ? half : v.size() - half;
    parts[r] = tensor_stats(begin, n, Format::fp16, RoundOptions{});
    dp.reduce(parts[r]);
    logs[r] = log_abs_moments(begin, n);
    dp.reduce(logs[r]);
    maxima[r] = {r == 0 ? 1.0 : 2.0, r == 0 ? std::nan("") : 3.0};
    dp.reduce_max(maxima[r].data(), 2);
  });
  for (const TensorStats& s : parts) {
    // Counts and binades exactly, extremes exactly; the sums to the rounding of another order.
    CHECK(s.zero == whole.zero);
    CHECK(s.underflow == whole.underflow);
    CHECK(s.subnormal == whole.subnormal);
    CHECK(s.normal == whole.normal);
    CHECK(s.overflow == whole.overflow);
    CHECK(s.elements == whole.elements);
    CHECK(s.count == whole.count);
    CHECK(s.binades == whole.binades);
    CHECK(s.min == whole.min);
    CHECK(s.max == whole.max);
    CHECK(s.max_abs == whole.max_abs);
    CHECK(s.min_nonzero_abs == whole.min_nonzero_abs);
    CHECK(s.sum == Approx(whole.sum).epsilon(1e-12));
    CHECK(s.sum_squares == Approx(whole.sum_squares).epsilon(1e-12));
  }
  CHECK(whole.underflow > 0);  // the values reach every class the reduction must add
  CHECK(whole.subnormal > 0);
  CHECK(whole.overflow > 0);
  // The same bits on both ranks.
  CHECK(parts[0].sum == parts[1].sum);
  for (const LogMoments& m : logs) {
    CHECK(m.count == whole_log.count);
    CHECK(m.mean == Approx(whole_log.mean).epsilon(1e-9));
    CHECK(m.stddev == Approx(whole_log.stddev).epsilon(1e-9));
  }
  for (const auto& m : maxima) {
    CHECK(m[0] == 2.0);
    CHECK(m[1] == std::numeric_limits<double>::infinity());  // NaN counts as +inf
  }
}

TEST_CASE(
    "two ranks (threads): a config or a file that differs stops both ranks with a ConfigError "
    "naming it",
    "[dist]") {
  using namespace gradscale;
  std::string messages[2], configs[2];
  on_two_ranks([&](int r, Communicator& comm) {
    DataParallel dp(comm);
    dp.check_same_input("content checksum xxh64:1", "the data 'mnist:d'");  // the same: passes
    dp.check_same_config(json{{"lr", 0.1}});
    try {
      dp.check_same_input(r == 0 ? "step 2" : "step 4", "the --resume checkpoint 'ck'");
    } catch (const ConfigError& e) {
      messages[r] = e.what();
    }
    try {
      dp.check_same_config(json{{"lr", 0.1 * (r + 1)}});
    } catch (const ConfigError& e) {
      configs[r] = e.what();
    }
  });
  const std::string head =
      "the ranks read different files: the --resume checkpoint 'ck' differs on rank 1 from rank "
      "0's (rank 0: step 2";
  const std::string tail = "); every rank must run the same command on the same files";
  CHECK(messages[0] == head + tail);
  CHECK(messages[1] == head + "; this rank, 1: step 4" + tail);
  CHECK(configs[0] ==
        "the ranks were started with different configs: rank 1 differs from rank 0 (every rank "
        "must run the same command and files)");
  CHECK(configs[1] ==
        "the ranks were started with different configs: rank 1 differs from rank 0; on this rank "
        "(1) first at 'lr' (every rank must run the same command and files)");
}

TEST_CASE("two ranks (threads): ScaledTraining::distribute takes one process's decisions", "[dist][api]") {
  using namespace gradscale;
  // A residual network (a join) with conv and linear layers, fp8_e5m2 gradients, adaptive measured
  // with S0 from the loss gradient (tests/thread_ranks.h).
  const nlohmann::json scaler = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}};
  constexpr int kSteps = gradscale::test::kResidualSteps;
  using Record = gradscale::test::RankRecord;
  auto train = [&](Communicator* comm) { return gradscale::test::train_residual(comm, scaler, nullptr); };
  const Record one = train(nullptr);
  Record ranks[2];
  on_two_ranks([&](int r, Communicator& comm) { ranks[r] = train(&comm); });
  int scaled = 0;
  for (const Record& rec : ranks) {
    CHECK(rec.s0 == one.s0);
    CHECK(rec.skipped == one.skipped);
    CHECK(rec.scales == one.scales);
    REQUIRE(rec.weights.size() == one.weights.size());
    // The weight gradients differ in their last fp32 bits before rounding (docs/distributed.md), so a
    // rounding to fp8 may land one step of fp8 apart: Adam moves such a weight by at most about lr per
    // step more or less.
    double max_diff = 0;
    for (std::size_t i = 0; i < one.weights.size(); ++i)
      for (std::size_t k = 0; k < one.weights[i].size(); ++k)
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(rec.weights[i][k] - one.weights[i][k])));
    INFO("max |w_rank - w_one| = " << max_diff);
    CHECK(max_diff <= 2 * 1e-3 * kSteps);
  }
  CHECK(ranks[0].weights == ranks[1].weights);  // the ranks themselves agree bit for bit
  for (const auto& step : one.scales)
    for (double s : step) scaled += s != 1.0;
  CHECK(scaled > 0);  // the controller scaled some layer: equal decisions are not trivially 1
}

TEST_CASE("two ranks (threads): a weight gradient in device memory needs device collectives", "[dist]") {
  using namespace gradscale;
  on_two_ranks([&](int, Communicator& comm) {
    DataParallel dp(comm);
    CHECK(dp.device() == nullptr);
    float g[2] = {1, 2};
    CHECK_THROWS_WITH(dp.reduce_sum_on_device(g, 2),
                      Catch::Matchers::Contains("in device memory, and this reducer has no collectives"));
    CHECK(dp.counts().gradient_collectives == 0);
  });
}

TEST_CASE("one process: the local communicator is rank 0 of 1 and reduces nothing", "[dist]") {
  gradscale::LocalCommunicator local;
  CHECK(local.rank() == 0);
  CHECK(local.size() == 1);
  double v[2] = {1.5, -2.25}, out[2] = {0, 0};
  local.all_gather(v, 2, out);
  CHECK(out[0] == 1.5);
  CHECK(out[1] == -2.25);
  gradscale::all_reduce_sum_ordered(local, v, 2);
  CHECK(v[0] == 1.5);
  gradscale::DataParallel dp(local);
  gradscale::TensorStats s;
  s.count = s.elements = s.normal = 3;
  s.sum = 0.5;
  dp.reduce(s);
  CHECK(s.count == 3);
  CHECK(s.sum == 0.5);
  CHECK(dp.counts().statistics_collectives == 0);
}
