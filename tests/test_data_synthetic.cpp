// Tests of lib/data's data specs and synthetic dataset: unknown specs are ConfigErrors listing the
// allowed forms; synthetic data is deterministic in its seed and learnable.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/skip.h"
#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/data/batcher.h"
#include "lib/data/dataset.h"
#include "lib/data/idx.h"
#include "lib/data/shuffle.h"
#include "lib/data/synthetic.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using namespace gradscale;
using gradscale::testing::TempDir;
using Bytes = std::vector<std::uint8_t>;
using Catch::Matchers::Contains;

TEST_CASE("unknown data specs are ConfigErrors listing the allowed forms", "[data]") {
  for (const char* spec :
       {"bogus", "Fashion-MNIST", "mnist", "mnist:", "synthetic:", "synthetic:0", "synthetic:-3",
        "synthetic:abc", "synthetic:12x", "synthetic:10000001", "synthetic:99999999999", ""}) {
    INFO("spec '" << spec << "'");
    try {
      load_data(spec, 1);
      FAIL("no error");
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Contains("'" + std::string(spec) + "'"));
      CHECK_THAT(msg, Contains("fashion-mnist") && Contains("mnist:DIR") && Contains("synthetic:N"));
    }
  }
}

TEST_CASE("synthetic data is deterministic in the seed", "[data]") {
  const DataSplit a = load_data("synthetic:200", 7);
  const DataSplit b = load_data("synthetic:200", 7);
  const DataSplit c = load_data("synthetic:200", 8);
  CHECK(a.train.images.shape() == Shape{200, 1, 28, 28});
  CHECK(a.test.images.shape() == Shape{50, 1, 28, 28});
  const auto same_bytes = [](const Tensor& x, const Tensor& y) {
    return x.size() == y.size() &&
           std::memcmp(x.data(), y.data(), static_cast<std::size_t>(x.size()) * sizeof(float)) == 0;
  };
  CHECK(same_bytes(a.train.images, b.train.images));
  CHECK(same_bytes(a.test.images, b.test.images));
  CHECK(a.train.labels == b.train.labels);
  CHECK(a.test.labels == b.test.labels);
  CHECK(a.source == b.source);
  CHECK_FALSE(same_bytes(a.train.images, c.train.images));
  CHECK_FALSE(same_bytes(a.test.images, c.test.images));
  CHECK(a.train.labels != c.train.labels);
  CHECK_FALSE(
      std::equal(a.test.images.data(), a.test.images.data() + a.test.images.size(), a.train.images.data()));
  CHECK_THAT(a.source, Contains("synthetic") && Contains("seed 7"));
  CHECK(load_data("synthetic:1", 0).test.size() == 1);

  // The defaults, all classes present, and normalised to mean 0 / std 1 by its own statistics.
  const DataSplit d = load_data("synthetic", 3);
  REQUIRE(d.train.size() == kSyntheticTrainSize);
  REQUIRE(d.test.size() == kSyntheticTestSize);
  std::set<std::int32_t> seen(d.train.labels.begin(), d.train.labels.end());
  CHECK(seen.size() == 10);
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == 9);
  const auto flat = d.train.images.rows_view();
  const double mean = flat.cast<double>().mean();
  const double var = (flat.cast<double>().array() - mean).square().mean();
  CHECK(std::abs(mean) < 1e-4);
  CHECK(std::sqrt(var) == Approx(1.0).epsilon(1e-4));
}

TEST_CASE("synthetic data is learnable: one epoch of softmax regression beats chance by far", "[data]") {
  const DataSplit split = load_data("synthetic", 11);
  const int features = 28 * 28, classes = 10;
  Eigen::MatrixXf w = Eigen::MatrixXf::Zero(features, classes);
  Batcher batcher(split.train, 32, 5);
  Tensor x;
  std::vector<std::int32_t> y;
  const float lr = 0.01f;
  while (batcher.next(x, y)) {
    const auto xb = x.rows_view();
    Eigen::MatrixXf p = xb * w;  // logits -> softmax probabilities, minus one-hot: d loss / d logits
    for (Eigen::Index i = 0; i < p.rows(); ++i) {
      p.row(i).array() = (p.row(i).array() - p.row(i).maxCoeff()).exp();
      p.row(i) /= p.row(i).sum();
      p(i, y[static_cast<std::size_t>(i)]) -= 1.0f;
    }
    w -= (lr / static_cast<float>(p.rows())) * (xb.transpose() * p);
  }
  const auto xt = split.test.images.rows_view();
  const Eigen::MatrixXf logits = xt * w;
  int correct = 0;
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    Eigen::Index best = 0;
    logits.row(i).maxCoeff(&best);
    correct += best == split.test.labels[static_cast<std::size_t>(i)] ? 1 : 0;
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(logits.rows());
  INFO("test accuracy after one epoch: " << accuracy);
  CHECK(accuracy > 0.8);  // chance is 0.1; this seed gives 0.93
}
