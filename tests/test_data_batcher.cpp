// Tests of lib/data's shuffling and seeded batch iterator: shuffle primitives fixed across platforms and
// unbiased, every example once per epoch in a new order, determinism in the seed, and checkpoint state.
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

namespace {

// N examples of shape [2, 1, 3] whose every value is the example's index; label = index % 7.
Dataset indexed_dataset(std::int64_t n) {
  Dataset d;
  d.images = Tensor({n, 2, 1, 3});
  for (std::int64_t k = 0; k < n; ++k) {
    for (int j = 0; j < 6; ++j) d.images[k * 6 + j] = static_cast<float>(k);
  }
  for (std::int64_t k = 0; k < n; ++k) d.labels.push_back(static_cast<std::int32_t>(k % 7));
  d.classes = 7;
  d.name = "indexed";
  return d;
}

// The next batch as example indices, checking that every element and label was written consistently.
std::vector<std::int64_t> next_indices(Batcher& b, Tensor& x, std::vector<std::int32_t>& y, bool& more) {
  x.fill(-1.0f);
  more = b.next(x, y);
  std::vector<std::int64_t> idx;
  if (!more) return idx;
  REQUIRE(x.rank() == 4);
  REQUIRE(x.dim(0) == static_cast<std::int64_t>(y.size()));
  for (std::int64_t i = 0; i < x.dim(0); ++i) {
    const float k = x[i * 6];
    for (int j = 1; j < 6; ++j) REQUIRE(x[i * 6 + j] == k);
    REQUIRE(y[static_cast<std::size_t>(i)] == static_cast<std::int32_t>(k) % 7);
    idx.push_back(static_cast<std::int64_t>(k));
  }
  return idx;
}

std::vector<std::vector<std::int64_t>> run_batches(Batcher& b, int count) {
  Tensor x;
  std::vector<std::int32_t> y;
  std::vector<std::vector<std::int64_t>> out;
  for (int i = 0; i < count; ++i) {
    bool more = false;
    out.push_back(next_indices(b, x, y, more));  // an empty entry marks an epoch end
  }
  return out;
}

}  // namespace

TEST_CASE("shuffle primitives are fixed across platforms and unbiased", "[data]") {
  // mt19937_64's 10000th output is fixed by the C++ standard; our order depends only on it.
  std::mt19937_64 standard;
  standard.discard(9999);
  CHECK(standard() == 9981545732273789042ull);
  // Golden order, cross-checked with an independent Python mt19937_64: another order on any platform
  // would break checkpoint portability.
  std::vector<std::int64_t> order;
  epoch_permutation(2024, 3, 10, order);
  CHECK(order == std::vector<std::int64_t>{2, 5, 6, 0, 1, 9, 8, 4, 7, 3});
  epoch_permutation(2024, 3, 0, order);
  CHECK(order.empty());
  epoch_permutation(2024, 3, 1, order);
  CHECK(order == std::vector<std::int64_t>{0});
  CHECK(mix_seed(1, 0) != mix_seed(1, 1));
  CHECK(mix_seed(1, 0) != mix_seed(2, 0));

  // bound = 3 * 2^62: plain r % bound would put half the draws below 2^62; the fair share is a third.
  std::mt19937_64 rng(42);
  const std::uint64_t bound = 3ull << 62;
  int below = 0;
  const int draws = 6000;
  for (int i = 0; i < draws; ++i) {
    const std::uint64_t v = draw_below(rng, bound);
    REQUIRE(v < bound);
    below += v < (1ull << 62) ? 1 : 0;
  }
  CHECK(static_cast<double>(below) / draws == Approx(1.0 / 3.0).margin(0.03));
  CHECK(draw_below(rng, 1) == 0);
}

TEST_CASE("the batcher visits every example exactly once per epoch, in a new order each epoch", "[data]") {
  const Dataset data = indexed_dataset(103);
  Batcher b(data, 10, 99);
  CHECK(b.batches_per_epoch() == 11);
  Tensor x;
  std::vector<std::int32_t> y;
  std::vector<std::vector<std::int64_t>> orders;
  const float* storage = nullptr;
  for (int epoch = 0; epoch < 3; ++epoch) {
    REQUIRE(b.epoch() == epoch);
    std::vector<std::int64_t> order;
    std::vector<std::int64_t> sizes;
    bool more = true;
    while (true) {
      const auto idx = next_indices(b, x, y, more);
      if (!more) break;
      sizes.push_back(static_cast<std::int64_t>(idx.size()));
      order.insert(order.end(), idx.begin(), idx.end());
      if (!storage) storage = x.data();
      CHECK(x.data() == storage);  // no reallocation after the first batch, partial batches included
    }
    CHECK(sizes == std::vector<std::int64_t>{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3});
    std::vector<std::int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> identity(103);
    std::iota(identity.begin(), identity.end(), 0);
    CHECK(sorted == identity);
    CHECK(order != identity);
    orders.push_back(order);
  }
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);
  CHECK(b.epoch() == 3);
  CHECK(b.position() == 0);

  Batcher ordered(data, 10, 99, false);
  std::vector<std::int64_t> seq;
  bool more = true;
  while (true) {
    const auto idx = next_indices(ordered, x, y, more);
    if (!more) break;
    seq.insert(seq.end(), idx.begin(), idx.end());
  }
  std::vector<std::int64_t> identity(103);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(seq == identity);

  Dataset empty;
  empty.images = Tensor({0, 1, 2, 2});
  CHECK_THROWS_AS(Batcher(empty, 4, 0), ConfigError);
  CHECK_THROWS_AS(Batcher(data, 0, 0), ConfigError);
}

TEST_CASE("the batcher is deterministic in its seed", "[data]") {
  const Dataset data = indexed_dataset(50);
  Batcher a(data, 8, 1), b(data, 8, 1), c(data, 8, 2);
  const auto ra = run_batches(a, 30), rb = run_batches(b, 30), rc = run_batches(c, 30);
  CHECK(ra == rb);
  CHECK(ra != rc);
}

TEST_CASE("a batcher restored from a mid-epoch state continues identically", "[data]") {
  const Dataset data = indexed_dataset(103);
  Batcher uninterrupted(data, 10, 77);
  const auto reference = run_batches(uninterrupted, 40);

  for (int stop : {0, 5, 11, 12, 16}) {  // 11: at the end of epoch 0 before next() has said so
    INFO("stopped after " << stop << " calls");
    Batcher first(data, 10, 77);
    run_batches(first, stop);
    const std::string saved = first.state().dump();
    Batcher resumed(data, 10, 77);
    resumed.restore(nlohmann::json::parse(saved));
    CHECK(resumed.epoch() == first.epoch());
    CHECK(resumed.position() == first.position());
    const auto rest = run_batches(resumed, 40 - stop);
    CHECK(rest == std::vector<std::vector<std::int64_t>>(reference.begin() + stop, reference.end()));
  }

  Batcher b(data, 10, 77);
  run_batches(b, 3);
  const nlohmann::json good = b.state();
  CHECK(good.at("position") == 30);
  const auto bad = [&](const char* key, const nlohmann::json& value, const std::string& problem) {
    nlohmann::json s = good;
    if (value.is_null()) {
      s.erase(key);
    } else {
      s[key] = value;
    }
    Batcher other(data, 10, 77);
    try {
      other.restore(s);
      FAIL("no error for " << s.dump());
    } catch (const ConfigError& e) {
      CHECK_THAT(std::string(e.what()), Contains(key) && Contains(problem));
    }
  };
  bad("seed", 78, "is 78 but this batcher has 77");
  bad("batch_size", 12, "is 12 but this batcher has 10");
  bad("size", 104, "is 104");
  bad("shuffle", false, "is false but this batcher has true");
  bad("epoch", nullptr, "missing key");
  bad("position", 104, "past the dataset size");
  bad("position", -1, "must be an integer >= 0");
  bad("epoch", "1", "must be an integer >= 0");
  Batcher other(data, 10, 77);
  CHECK_THROWS_AS(other.restore(nlohmann::json::array()), ConfigError);
}
