// Tests of how lib/layers carry the loss scale through backward: a local scale s multiplies the
// upstream gradient exactly, a static power-of-two S leaves fp32 weight gradients bit-identical, and
// non-finite gradients set found_inf naming the first layer in backward order.
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

TEST_CASE("A local scale s multiplies the upstream gradient exactly and the scale becomes s·S", "[layers]") {
  Rng rng(30);
  auto run = [](Layer& layer, const Tensor& x, const Tensor& g, double s) {
    Runner r;
    r.monitor.reset(4, false, 0.0);
    layer.set_id(3);
    layer.prepare_weights(r.precision);
    r.scaler.local = s;
    Tensor y;
    r.forward(layer, {x}, y);
    auto gx = r.backward(layer, {x}, y, ScaledGrad{g, 2.0});
    REQUIRE(r.scaler.queries == 1);
    CHECK(r.scaler.last.layer_id == 3);
    CHECK(r.scaler.last.scale_in == 2.0);
    CHECK(r.scaler.last.reduction == layer.reduction_length());
    CHECK(r.scaler.last.grad_size == g.size());
    // The controller saw the fp32 upstream gradient before s was applied.
    REQUIRE(static_cast<std::int64_t>(r.scaler.last_upstream.size()) == gx[0].g.size());
    for (std::int64_t i = 0; i < gx[0].g.size(); ++i)
      CHECK(gx[0].g[i] == static_cast<float>(s) * r.scaler.last_upstream[static_cast<std::size_t>(i)]);
    return gx[0];
  };
  SECTION("Linear") {
    Linear fc("fc", 7, 5, true, kaiming(), rng);
    CHECK(fc.reduction_length() == 5);
    const Tensor x = make_normal({4, 7}, 31), g = make_normal({4, 5}, 32);
    const ScaledGrad one = run(fc, x, g, 1.0), four = run(fc, x, g, 4.0);
    CHECK(one.scale == 2.0);
    CHECK(four.scale == 8.0);
    for (std::int64_t i = 0; i < one.g.size(); ++i) CHECK(four.g[i] == 4.0f * one.g[i]);
  }
  SECTION("Conv2d") {
    Conv2d conv("conv", 2, 3, 3, 2, 1, true, kaiming(), rng);
    CHECK(conv.reduction_length() == 3 * 3 * 3);
    const Tensor x = make_normal({2, 2, 7, 6}, 33), g = make_normal({2, 3, 4, 3}, 34);
    const ScaledGrad one = run(conv, x, g, 1.0), four = run(conv, x, g, 4.0);
    CHECK(one.scale == 2.0);
    CHECK(four.scale == 8.0);
    for (std::int64_t i = 0; i < one.g.size(); ++i) CHECK(four.g[i] == 4.0f * one.g[i]);
  }
}

TEST_CASE("A static power-of-two S gives bit-identical fp32 weight gradients to S = 1", "[layers]") {
  // Multiplying g by 2^e scales every product and partial sum exactly (no overflow or underflow at these
  // magnitudes), and accumulate_weight_grad divides by 2^e exactly: the master gradients agree bit for bit.
  Rng rng(35);
  auto grads = [](Layer& layer, const Tensor& x, const Tensor& g, double scale, Tensor& gx) {
    Runner r;
    r.monitor.reset(1, false, 0.0);
    layer.set_id(0);
    layer.prepare_weights(r.precision);
    for (Parameter* p : layer.parameters()) p->grad.fill(0.0f);
    Tensor y;
    r.forward(layer, {x}, y);
    Tensor gs = g;
    for (std::int64_t i = 0; i < gs.size(); ++i) gs[i] *= static_cast<float>(scale);
    const auto out = r.backward(layer, {x}, y, ScaledGrad{gs, scale});
    CHECK(out[0].scale == scale);
    gx = out[0].g;
    std::vector<Tensor> result;
    for (Parameter* p : layer.parameters()) result.push_back(p->grad);
    return result;
  };
  auto compare = [&](Layer& layer, const Tensor& x, const Tensor& g) {
    Tensor gx1, gxs;
    const auto ref = grads(layer, x, g, 1.0, gx1);
    for (double s : {0x1p-4, 0x1p10, 0x1p16}) {
      INFO("S = " << s);
      const auto got = grads(layer, x, g, s, gxs);
      REQUIRE(got.size() == ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        REQUIRE(any_nonzero(ref[i]));
        CHECK(same_bits(got[i], ref[i]));
      }
      for (std::int64_t i = 0; i < gx1.size(); ++i) CHECK(gxs[i] == static_cast<float>(s) * gx1[i]);
    }
  };
  SECTION("Linear") {
    Linear fc("fc", 40, 12, true, kaiming(), rng);
    compare(fc, make_normal({16, 40}, 36), make_normal({16, 12}, 37));
  }
  SECTION("Conv2d") {
    Conv2d conv("conv", 3, 6, 3, 1, 1, true, kaiming(), rng);
    compare(conv, make_normal({5, 3, 8, 8}, 38), make_normal({5, 6, 8, 8}, 39));
  }
}

TEST_CASE("Non-finite gradients set found_inf and name the first layer in backward order", "[layers]") {
  Rng rng(40);
  SECTION("an inf in the incoming gradient of Linear") {
    Runner r;
    r.monitor.reset(8, true, 0.0);
    Linear fc("fc", 3, 2, true, kaiming(), rng);
    fc.set_id(6);
    fc.prepare_weights(r.precision);
    const Tensor x = make_normal({2, 3}, 41);
    Tensor y;
    r.forward(fc, {x}, y);
    Tensor g = make_normal({2, 2}, 42);
    g[1] = std::numeric_limits<float>::infinity();
    r.backward(fc, {x}, y, ScaledGrad{g, 1.0});
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 6);
    CHECK(r.monitor.records[6].activation_grad.nonfinite > 0);
  }
  SECTION("fp16 overflow of the upstream and weight gradients; the first layer in backward order wins") {
    // g = 49152 is exact in fp16; g·W = 98304 and x·g = 196608 exceed 65504 and round to inf.
    Runner r(Format::fp16);
    r.monitor.reset(8, true, 0.0);
    Linear first("first", 1, 1, false, kaiming(), rng), second("second", 1, 1, false, kaiming(), rng);
    first.set_id(2);
    second.set_id(5);
    for (Linear* l : {&first, &second}) {
      l->parameters()[0]->value[0] = 2.0f;
      l->prepare_weights(r.precision);
    }
    Tensor x({1, 1}, 0.5f), y;
    const Tensor g({1, 1}, 49152.0f);
    r.forward(second, {x}, y);
    const auto gx =
        r.backward(second, {x}, y, ScaledGrad{g, 1.0});  // upstream overflows, weight grad does not
    CHECK(std::isinf(gx[0].g[0]));
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 5);
    CHECK(r.monitor.records[5].activation_grad.overflow == 1);
    CHECK(std::isfinite(second.parameters()[0]->grad[0]));
    x[0] = 4.0f;
    r.forward(first, {x}, y);
    r.backward(first, {x}, y, ScaledGrad{g, 1.0}, /*skip_inputs=*/true);  // weight gradient overflows
    CHECK(std::isinf(first.parameters()[0]->grad[0]));
    CHECK(r.monitor.first_nonfinite_layer == 5);  // still the first one seen

    r.monitor.reset(8, false, 0.0);
    r.backward(first, {x}, y, ScaledGrad{g, 1.0}, true);
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 2);
  }
  SECTION("fp16 overflow in a rounding non-parametric layer (Dropout's 1/(1 − p))") {
    Runner r(Format::fp16);
    r.monitor.reset(2, false, 0.0);
    Dropout drop("drop", 0.5);
    drop.set_id(1);
    const Tensor x({1, 64}, 1.0f), g({1, 64}, 49152.0f);  // kept values become 98304 -> inf
    Tensor y;
    r.forward(drop, {x}, y);
    r.backward(drop, {x}, y, ScaledGrad{g, 1.0});
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 1);
  }
  SECTION("a finite fp16 backward leaves found_inf clear") {
    Runner r(Format::fp16);
    r.monitor.reset(1, false, 0.0);
    Conv2d conv("conv", 1, 2, 3, 1, 1, true, kaiming(), rng);
    conv.set_id(0);
    conv.prepare_weights(r.precision);
    const Tensor x = make_grid({2, 1, 4, 4}, 43, -4, 4, 0.25), g = make_grid({2, 2, 4, 4}, 44, -4, 4, 0.25);
    Tensor y;
    r.forward(conv, {x}, y);
    r.backward(conv, {x}, y, ScaledGrad{g, 1.0});
    CHECK_FALSE(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == -1);
  }
}
