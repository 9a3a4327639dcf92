// Tests of lib/layers' contracts beyond the numbers: shape errors name the layer, MaxPool2d routes ties
// to the first maximum, and Conv2d's backward is bit-deterministic.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/core/random.h"
#include "lib/layers/add.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/dropout.h"
#include "lib/layers/linear.h"
#include "lib/layers/pool.h"
#include "lib/layers/relu.h"
#include "lib/scaler/scaler.h"
#include "tests/layers_fixtures.h"

using namespace gradscale;
using nlohmann::json;
using namespace gradscale::test::layers_fixtures;

TEST_CASE("Shape errors name the layer", "[layers]") {
  Rng rng(45);
  Linear fc("fc_bad", 4, 2, true, kaiming(), rng);
  Conv2d conv("conv_bad", 3, 2, 3, 1, 0, true, kaiming(), rng);
  MaxPool2d pool("pool_bad", 2);
  GlobalAvgPool gap("gap_bad");
  BatchNorm bn("bn_bad", 3);
  Add add("add_bad");
  require_shape_error_naming("fc_bad", [&] { fc.output_shape({{2, 5}}); });
  require_shape_error_naming("conv_bad", [&] { conv.output_shape({{2, 2, 5, 5}}); });
  require_shape_error_naming("conv_bad", [&] { conv.output_shape({{2, 3, 5}}); });
  require_shape_error_naming("conv_bad", [&] { conv.output_shape({{2, 3, 2, 5}}); });
  require_shape_error_naming("pool_bad", [&] { pool.output_shape({{2, 3, 1, 5}}); });
  require_shape_error_naming("gap_bad", [&] { gap.output_shape({{2, 3}}); });
  require_shape_error_naming("bn_bad", [&] { bn.output_shape({{2, 4}}); });
  require_shape_error_naming("add_bad", [&] { add.output_shape({{2, 3}, {2, 4}}); });
  require_shape_error_naming("add_bad", [&] { add.output_shape({{2, 3}}); });
  // Through forward as well.
  Runner r;
  conv.prepare_weights(r.precision);
  Tensor y;
  require_shape_error_naming("conv_bad", [&] { r.forward(conv, {Tensor({1, 2, 5, 5})}, y); });
  require_shape_error_naming("add_bad", [&] { r.forward(add, {Tensor({3}), Tensor({4})}, y); });
  // Configuration errors name the layer too.
  CHECK_THROWS_AS(Conv2d("c", 0, 2, 3, 1, 0, true, kaiming(), rng), ConfigError);
  CHECK_THROWS_AS(MaxPool2d("p", 0), ConfigError);
  CHECK_THROWS_AS(Dropout("d", 1.0), ConfigError);
  CHECK_THROWS_AS(BatchNorm("b", 2, 0.0), ConfigError);
}

TEST_CASE("MaxPool2d routes ties to the first maximum", "[layers]") {
  MaxPool2d pool("pool", 2);
  Runner r;
  const Tensor x({1, 1, 2, 2}, 3.0f);
  Tensor y;
  r.forward(pool, {x}, y);
  const auto gx = r.backward(pool, {x}, y, ScaledGrad{Tensor({1, 1, 1, 1}, 5.0f), 8.0});
  CHECK(gx[0].g[0] == 5.0f);
  CHECK(gx[0].g[1] == 0.0f);
  CHECK(gx[0].g[2] == 0.0f);
  CHECK(gx[0].g[3] == 0.0f);
  CHECK(gx[0].scale == 8.0);
}

TEST_CASE("Conv2d backward is bit-deterministic and skips the upstream gradient of a first layer",
          "[layers]") {
  Rng rng(46);
  Conv2d conv("conv", 4, 8, 3, 1, 1, true, kaiming(), rng);
  const Tensor x = make_normal({6, 4, 9, 9}, 47), g = make_normal({6, 8, 9, 9}, 48);
  // The forward mode (training or not) must not change what backward computes.
  auto run = [&](bool with_input, bool training_forward) {
    return conv_gradients(conv, x, g, with_input, training_forward);
  };
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    omp_set_num_threads(threads);
    const auto a = run(true, true), b = run(true, true), c = run(true, false);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(same_bits(a[i], b[i]));
      CHECK(same_bits(a[i], c[i]));
    }
    const auto first = run(false, true);
    CHECK(first[0].empty());
    for (std::size_t i = 1; i < a.size(); ++i) CHECK(same_bits(a[i], first[i]));
  }
  omp_set_num_threads(saved_threads);
}
