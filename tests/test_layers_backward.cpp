// Tests of lib/layers' backward passes: every layer's backward against central finite differences of
// its own forward (loss L = Σ w_out ⊙ y), Conv2d's sparse and dense paths against each other, and
// BatchNorm's running statistics against PyTorch's.
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

TEST_CASE("Linear backward matches finite differences", "[layers]") {
  Rng rng(1);
  for (bool bias : {true, false}) {
    Linear layer("fc", 5, 4, bias, kaiming(), rng);
    set_exact_parameters(layer, 2);
    FdCheck check(layer, {make_grid({3, 5}, 3, -8, 8, 0.25)}, FdOptions{});
    check.run();
  }
}

TEST_CASE("Conv2d backward matches finite differences (stride, padding, no bias)", "[layers]") {
  struct Case {
    std::int64_t kernel, stride, padding;
    bool bias;
    Shape input;
  };
  const std::vector<Case> cases = {{3, 2, 1, true, {2, 2, 6, 5}},
                                   {3, 1, 1, true, {2, 2, 5, 4}},
                                   {2, 1, 0, false, {1, 3, 4, 5}},
                                   {3, 3, 2, true, {2, 1, 7, 6}}};
  Rng rng(4);
  for (const Case& c : cases) {
    INFO("kernel " << c.kernel << " stride " << c.stride << " padding " << c.padding);
    Conv2d layer("conv", c.input[1], 3, c.kernel, c.stride, c.padding, c.bias, kaiming(), rng);
    set_exact_parameters(layer, 5);
    FdCheck check(layer, {make_grid(c.input, 6, -8, 8, 0.25)}, FdOptions{});
    check.run();
  }
}

TEST_CASE("Conv2d sparse backward path matches finite differences", "[layers]") {
  Rng rng(41);
  for (std::int64_t stride : {1, 2}) {
    INFO("stride " << stride);
    Conv2d layer("conv", 8, 3, 3, stride, 1, true, kaiming(), rng);
    layer.set_sparse_backward_density(1.0);  // every sample takes the sparse path
    set_exact_parameters(layer, 42);
    FdCheck check(layer, {make_grid({2, 8, 5, 4}, 43, -8, 8, 0.25)}, FdOptions{});
    check.run();
  }
}

TEST_CASE("Conv2d sparse and dense backward paths give the same bits on exact values", "[layers]") {
  // Grid values keep every product and partial sum exact, so the two summation orders must agree
  // bit for bit; a wrong index in the channels-last patches or the weight permutation cannot.
  struct Case {
    std::int64_t c, o, kernel, stride, pad;
    bool bias;
    Shape hw;
  };
  const std::vector<Case> cases = {{8, 5, 3, 1, 1, true, {7, 6}},
                                   {6, 4, 3, 2, 1, true, {9, 8}},
                                   {16, 3, 2, 1, 0, false, {5, 5}},
                                   {4, 2, 5, 3, 2, true, {11, 10}}};
  const int saved_threads = omp_get_max_threads();
  for (const Case& cs : cases) {
    INFO("C " << cs.c << " kernel " << cs.kernel << " stride " << cs.stride << " pad " << cs.pad);
    Rng rng(44);
    Conv2d conv("conv", cs.c, cs.o, cs.kernel, cs.stride, cs.pad, cs.bias, kaiming(), rng);
    set_exact_parameters(conv, 45);
    const Tensor x = make_grid({5, cs.c, cs.hw[0], cs.hw[1]}, 46, -8, 8, 0.25);
    Shape ys = conv.output_shape({x.shape()});
    // Samples 0, 2, 4: about 80% zeros; samples 1, 3: dense. The default threshold mixes the paths.
    Tensor g = make_grid(ys, 47, -3, 3, 1.0, true);
    Rng keep(48);
    const std::int64_t per_sample = g.size() / 5;
    for (std::int64_t i = 0; i < g.size(); ++i)
      if ((i / per_sample) % 2 == 0 && uniform_below(keep, 5) != 0) g[i] = 0.0f;
    auto run = [&](double density, bool with_input) {
      conv.set_sparse_backward_density(density);
      return conv_gradients(conv, x, g, with_input);
    };
    for (int threads : {1, 2}) {
      INFO(threads << " threads");
      omp_set_num_threads(threads);
      for (bool with_input : {true, false}) {
        INFO("input gradient " << with_input);
        const auto dense = run(0.0, with_input);
        const auto sparse = run(1.0, with_input), mixed = run(Conv2d::kDefaultSparseDensity, with_input);
        REQUIRE(any_nonzero(dense[1]));
        if (with_input) REQUIRE(any_nonzero(dense[0]));
        for (std::size_t k = 0; k < dense.size(); ++k) {
          INFO("output " << k);
          CHECK(same_bits(dense[k], sparse[k]));
          CHECK(same_bits(dense[k], mixed[k]));
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("ReLU and Flatten backward match finite differences", "[layers]") {
  // Odd multiples of 1/4: |x| >= 1/4 > h, no step crosses the kink at 0.
  Tensor x = make_grid({2, 3, 2, 2}, 7, -4, 3, 0.25);
  for (std::int64_t i = 0; i < x.size(); ++i) x[i] = x[i] * 2 + 0.25f;
  ReLU relu("relu");
  FdCheck(relu, {x}, FdOptions{}).run();
  Flatten flatten("flatten");
  FdCheck(flatten, {x}, FdOptions{}).run();
}

TEST_CASE("MaxPool2d backward matches finite differences", "[layers]") {
  // Distinct values 1/4 apart (a shuffled ramp): no window has a tie within 2h, argmax is stable.
  const Shape s{2, 2, 5, 6};
  Tensor x(s);
  std::vector<int> perm(static_cast<std::size_t>(x.size()));
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
  Rng rng(8);
  for (std::size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[uniform_below(rng, i + 1)]);
  for (std::int64_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(perm[static_cast<std::size_t>(i)] - 30) * 0.25f;
  SECTION("kernel 2, stride 2") {
    MaxPool2d pool("pool", 2);
    FdCheck(pool, {x}, FdOptions{}).run();
  }
  SECTION("overlapping windows: kernel 3, stride 2") {
    MaxPool2d pool("pool", 3, 2);
    FdCheck(pool, {x}, FdOptions{}).run();
  }
}

TEST_CASE("GlobalAvgPool backward matches finite differences", "[layers]") {
  // H·W = 6: the mean is rounded once (double sum of exact values, one rounding to fp32), the gradient
  // g/6 once; L is linear in x, so there is no truncation error.
  GlobalAvgPool pool("gap");
  FdOptions opt;
  opt.forward_rel = kU32;
  opt.grad_rel = kU32;
  FdCheck(pool, {make_grid({2, 3, 3, 2}, 9, -8, 8, 0.25)}, opt).run();
}

TEST_CASE("BatchNorm backward matches finite differences (train and eval, 1d and 2d)", "[layers]") {
  // Outputs and gradients are computed in double and rounded once to fp32 (forward_rel, grad_rel = u);
  // double-precision intermediates of O(1) values err by ~1e-15, bounded here by 1e-12 per element.
  // BatchNorm is nonlinear in x (through the batch statistics): the truncation error is estimated.
  FdOptions opt;
  opt.h = 1.0 / 64;
  opt.forward_rel = kU32;
  opt.forward_abs = 1e-12;
  opt.grad_rel = kU32;
  opt.smooth = true;
  auto set_affine = [](BatchNorm& bn, std::uint64_t seed) {
    Rng rng(seed);
    fill_normal(bn.parameters()[0]->value, rng, 0.5, 1.0);
    fill_normal(bn.parameters()[1]->value, rng, 0.5, 0.0);
  };
  SECTION("1d train") {
    BatchNorm bn("bn1", 3);
    set_affine(bn, 10);
    FdCheck(bn, {make_normal({6, 3}, 11, 1.5, 0.5)}, opt).run();
  }
  SECTION("2d train") {
    BatchNorm bn("bn2", 2);
    set_affine(bn, 12);
    FdCheck(bn, {make_normal({2, 2, 3, 2}, 13, 1.0, -0.5)}, opt).run();
  }
  SECTION("2d eval") {
    BatchNorm bn("bn3", 2);
    set_affine(bn, 14);
    auto buffers = bn.buffers();
    REQUIRE(buffers.size() == 2);
    CHECK(buffers[0].first == "bn3.running_mean");
    CHECK(buffers[1].first == "bn3.running_var");
    (*buffers[0].second)[0] = 0.25f;
    (*buffers[0].second)[1] = -1.0f;
    (*buffers[1].second)[0] = 2.0f;
    (*buffers[1].second)[1] = 0.5f;
    opt.smooth = false;  // affine in x with the running statistics
    FdCheck(bn, {make_normal({2, 2, 3, 2}, 15)}, opt, /*training=*/false).run();
  }
}

TEST_CASE("BatchNorm running statistics follow PyTorch", "[layers]") {
  BatchNorm bn("bn", 2, 1e-5, 0.1);
  Precision p;
  bn.prepare_weights(p);
  const Tensor x = make_normal({4, 2, 2, 3}, 16, 2.0, 1.0);
  Tensor y;
  Rng rng(1);
  ForwardContext ctx{p, true, &rng};
  bn.forward({&x}, y, ctx);
  for (std::int64_t c = 0; c < 2; ++c) {
    double sum = 0, ss = 0;
    const int m = 4 * 6;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) sum += x[(n * 2 + c) * 6 + i];
    const double mean = sum / m;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) ss += std::pow(x[(n * 2 + c) * 6 + i] - mean, 2);
    // Running values are stored in fp32: one rounding of a double result.
    CHECK(bn.buffers()[0].second->operator[](c) == Approx(0.1 * mean).epsilon(2 * kU32));
    CHECK(bn.buffers()[1].second->operator[](c) == Approx(0.9 + 0.1 * ss / (m - 1)).epsilon(2 * kU32));
    // The training output is normalised per channel (γ = 1, β = 0): mean 0, biased variance 1 − O(eps).
    double ym = 0, yv = 0;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) ym += y[(n * 2 + c) * 6 + i];
    ym /= m;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) yv += std::pow(y[(n * 2 + c) * 6 + i] - ym, 2);
    CHECK(std::abs(ym) < 1e-6);
    CHECK(yv / m == Approx(ss / m / (ss / m + 1e-5)).epsilon(1e-6));
  }
  // One value per channel cannot be normalised in training.
  const Tensor single = make_normal({1, 2}, 17);
  require_shape_error_naming("bn", [&] { bn.forward({&single}, y, ctx); });
}

TEST_CASE("Dropout backward matches finite differences with a fixed mask", "[layers]") {
  // p = 1/4: the factor float(4/3) is inexact, so x·f and g·f are rounded once each; linear in x.
  Dropout drop("drop", 0.25);
  FdOptions opt;
  opt.forward_rel = kU32;
  opt.grad_rel = kU32;
  const Tensor x = make_grid({4, 10}, 18, -8, 8, 0.25, true);
  FdCheck(drop, {x}, opt).run();

  // The mask keeps and drops (x is never 0), the same seed gives the same mask, eval is the identity.
  Runner r;
  Tensor y1, y2;
  r.forward(drop, {x}, y1);
  r.forward(drop, {x}, y2);
  CHECK(same_bits(y1, y2));
  int dropped = 0;
  for (std::int64_t i = 0; i < y1.size(); ++i) dropped += y1[i] == 0.0f;
  CHECK(dropped > 0);
  CHECK(dropped < y1.size());
  r.training = false;
  r.forward(drop, {x}, y1);
  CHECK(same_bits(y1, x));
}

TEST_CASE("Add backward matches finite differences and passes the scale to both inputs", "[layers]") {
  Add add("join");
  CHECK(add.num_inputs() == 2);
  FdCheck(add, {make_grid({2, 3, 2}, 19, -8, 8, 0.25), make_grid({2, 3, 2}, 20, -8, 8, 0.25)}, FdOptions{})
      .run();

  Runner r;
  const std::vector<Tensor> in = {make_grid({5}, 21, -8, 8, 1), make_grid({5}, 22, -8, 8, 1)};
  Tensor y;
  r.forward(add, in, y);
  const Tensor g = make_grid({5}, 23, -8, 8, 1);
  const auto gx = r.backward(add, in, y, ScaledGrad{g, 512.0});
  for (const ScaledGrad& s : gx) {
    CHECK(same_bits(s.g, g));
    CHECK(s.scale == 512.0);
  }
}
