// Tests of lib/layers' forward passes: Linear and Conv2d against naive fp64 references, and the
// emulated fp16 GEMM against quantize(fp32 GEMM of quantized inputs).
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

TEST_CASE("Linear and Conv2d forward match a naive fp64 reference", "[layers]") {
  // Any summation order of the K products and the bias errs by at most γ_{K+2}·(Σ|x·w| + |b|) with
  // γ_n = n·u/(1 − n·u) (the products' own roundings included).
  auto gamma = [](std::int64_t n) {
    return static_cast<double>(n) * kU32 / (1 - static_cast<double>(n) * kU32);
  };
  Rng rng(24);
  Precision p;
  Rng drop(0);
  ForwardContext ctx{p, true, &drop};
  SECTION("Linear") {
    const std::int64_t in = 300, out = 17, n = 9;
    Linear fc("fc", in, out, true, kaiming(), rng);
    fill_normal(fc.parameters()[1]->value, rng);
    fc.prepare_weights(p);
    const Tensor x = make_normal({n, in}, 25);
    Tensor y({n, out}, std::numeric_limits<float>::quiet_NaN());
    fc.forward({&x}, y, ctx);
    const Tensor& w = fc.parameters()[0]->value;
    const Tensor& b = fc.parameters()[1]->value;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) {
        double ref = b[o], mag = std::abs(b[o]);
        for (std::int64_t k = 0; k < in; ++k) {
          ref += static_cast<double>(x[i * in + k]) * w[o * in + k];
          mag += std::abs(static_cast<double>(x[i * in + k]) * w[o * in + k]);
        }
        CHECK(std::abs(y[i * out + o] - ref) <= gamma(in + 2) * mag);
      }
  }
  SECTION("Conv2d") {
    struct Case {
      std::int64_t c, o, k, stride, pad;
      Shape input;
    };
    for (const Case& cs : {Case{3, 8, 3, 1, 1, {3, 3, 9, 8}}, Case{4, 5, 3, 2, 1, {2, 4, 9, 10}},
                           Case{2, 3, 1, 2, 0, {2, 2, 7, 7}}}) {
      Conv2d conv("conv", cs.c, cs.o, cs.k, cs.stride, cs.pad, true, kaiming(), rng);
      fill_normal(conv.parameters()[1]->value, rng);
      conv.prepare_weights(p);
      const Tensor x = make_normal(cs.input, 26);
      Tensor y(conv.output_shape({x.shape()}), std::numeric_limits<float>::quiet_NaN());
      conv.forward({&x}, y, ctx);
      std::vector<double> mag;
      const auto ref = conv_reference(x, conv.parameters()[0]->value, &conv.parameters()[1]->value, cs.stride,
                                      cs.pad, mag);
      REQUIRE(static_cast<std::size_t>(y.size()) == ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        INFO("element " << i << " got " << y[static_cast<std::int64_t>(i)] << " want " << ref[i]);
        CHECK(std::abs(y[static_cast<std::int64_t>(i)] - ref[i]) <= gamma(cs.c * cs.k * cs.k + 2) * mag[i]);
      }
      // Eval mode (columns not kept) gives the same bits.
      Tensor y_eval;
      ForwardContext eval{p, false, &drop};
      conv.forward({&x}, y_eval, eval);
      CHECK(same_bits(y, y_eval));
    }
  }
}

TEST_CASE("Emulated fp16 GEMMs equal quantize(fp32 GEMM of quantized inputs)", "[layers]") {
  // Inputs are integers (|x| <= 63) and master weights are k/64 plus 2^-19, which fp16 rounds away;
  // every product k·x/64 and every sum of K of them is a multiple of 1/64 below 2^17/64: exact in fp32 in
  // any order, while the outputs need up to 17 bits, so the final rounding to fp16 is exercised.
  Precision p;
  p.format = Format::fp16;
  Rng rng(27);
  Rng drop(0);
  ForwardContext ctx{p, true, &drop};
  auto set_master = [](Parameter& param, Rng& r, double unit) {
    for (std::int64_t i = 0; i < param.value.size(); ++i) {
      int k = 0;
      while (k == 0) k = -63 + static_cast<int>(uniform_below(r, 127));
      param.value[i] = static_cast<float>(k * unit + 0x1p-19 * (k > 0 ? 1 : -1));
    }
  };
  auto quantized = [&](const Tensor& t) {
    Tensor q(t.shape());
    quantize(t.data(), q.data(), static_cast<std::size_t>(t.size()), p.format, p.round);
    return q;
  };
  auto check_output = [&](const Tensor& y, const std::vector<double>& ref) {
    REQUIRE(static_cast<std::size_t>(y.size()) == ref.size());
    int rounded = 0;
    for (std::int64_t i = 0; i < y.size(); ++i) {
      REQUIRE_FALSE(std::isnan(y[i]));  // the sentinel was overwritten
      const float fp32 = static_cast<float>(ref[static_cast<std::size_t>(i)]);
      REQUIRE(static_cast<double>(fp32) == ref[static_cast<std::size_t>(i)]);  // exact by construction
      const float want = quantize(fp32, Format::fp16);
      CHECK(y[i] == want);
      rounded += want != fp32;
    }
    CHECK(rounded > 0);
  };
  SECTION("Linear") {
    const std::int64_t in = 32, out = 6, n = 5;
    Linear fc("fc", in, out, true, kaiming(), rng);
    set_master(*fc.parameters()[0], rng, 1.0 / 64);
    set_master(*fc.parameters()[1], rng, 1.0 / 4);
    fc.prepare_weights(p);
    const Tensor x = make_grid({n, in}, 28, -63, 63, 1);
    const Tensor wq = quantized(fc.parameters()[0]->value), bq = quantized(fc.parameters()[1]->value);
    for (std::int64_t i = 0; i < wq.size(); ++i) REQUIRE(wq[i] * 64 == std::round(wq[i] * 64));
    Tensor y({n, out}, std::numeric_limits<float>::quiet_NaN());
    fc.forward({&x}, y, ctx);
    std::vector<double> ref(static_cast<std::size_t>(n * out));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) {
        double acc = bq[o];
        for (std::int64_t k = 0; k < in; ++k) acc += static_cast<double>(x[i * in + k]) * wq[o * in + k];
        ref[static_cast<std::size_t>(i * out + o)] = acc;
      }
    check_output(y, ref);
  }
  SECTION("Conv2d") {
    Conv2d conv("conv", 3, 4, 3, 1, 1, true, kaiming(), rng);
    set_master(*conv.parameters()[0], rng, 1.0 / 64);
    set_master(*conv.parameters()[1], rng, 1.0 / 4);
    conv.prepare_weights(p);
    const Tensor x = make_grid({2, 3, 5, 6}, 29, -63, 63, 1);
    Tensor wq = quantized(conv.parameters()[0]->value), bq = quantized(conv.parameters()[1]->value);
    Tensor y(conv.output_shape({x.shape()}), std::numeric_limits<float>::quiet_NaN());
    conv.forward({&x}, y, ctx);
    std::vector<double> mag;
    check_output(y, conv_reference(x, wq, &bq, 1, 1, mag));
  }
}
