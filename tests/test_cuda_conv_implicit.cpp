// Tests of lib/cuda's implicit-GEMM convolutions (conv_implicit.h): on arbitrary floats, every output is
// the fp32 sum of its column rows in order, one fused multiply-add each, plus the bias, rounded once to
// F, and every upstream element its taps' column entries in col2im's order — the bits of host loops that
// do exactly that, on a GPU and on the CPU execution target; on exact values, the CPU Conv2d's forward
// and backward passes; bad geometry refused by name (built only with CUDA; every case skips visibly
// without a GPU).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lib/core/random.h"
#include "lib/cuda/context.h"
#include "lib/cuda/conv_implicit.h"
#include "lib/layers/conv2d.h"
#include "lib/numeric/quantize.h"
#include "tests/cuda_layers_fixtures.h"
#include "tests/cuda_test.h"

using namespace gradscale;
using test::bit_mismatches;
using namespace gradscale::test::cuda_layers_fixtures;

namespace {

struct Case {
  std::int64_t n, c, h, w, o, kernel, stride, pad;
};

// The reference: for each output, acc = fma(W[o][r], cols[r], acc) for r = 0..C·k²−1 from +0 (the
// padding's zeros included), then acc + b, then quantize to F.
std::vector<float> reference(const Case& k, const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>* bias, Format f) {
  const cuda::ConvGeometry g{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
  const std::int64_t ho = g.ho(), wo = g.wo(), rows = g.col_rows();
  std::vector<float> y(static_cast<std::size_t>(k.n * k.o * ho * wo));
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t b = 0; b < k.n; ++b)
    for (std::int64_t o = 0; o < k.o; ++o)
      for (std::int64_t oh = 0; oh < ho; ++oh)
        for (std::int64_t ow = 0; ow < wo; ++ow) {
          float acc = 0.0f;
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t c = r / (k.kernel * k.kernel), ki = r / k.kernel % k.kernel, kj = r % k.kernel;
            const std::int64_t ih = oh * k.stride - k.pad + ki, iw = ow * k.stride - k.pad + kj;
            const float v = ih >= 0 && ih < k.h && iw >= 0 && iw < k.w ? x[at(((b * k.c + c) * k.h + ih) * k.w + iw)]
                                                                       : 0.0f;
            acc = std::fma(w[at(o * rows + r)], v, acc);
          }
          if (bias != nullptr) acc = acc + (*bias)[at(o)];
          y[at(((b * k.o + o) * ho + oh) * wo + ow)] = quantize(acc, f);
        }
  return y;
}

// The upstream reference: each input element's taps in (ki, kj) order, each tap that reaches an output
// position adding its column entry Σ_o fma(W[o][c][ki][kj], g[b][o][oh][ow], ·) from +0 (o in order).
std::vector<float> upstream_reference(const Case& k, const std::vector<float>& g, const std::vector<float>& w) {
  const cuda::ConvGeometry geo{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
  const std::int64_t ho = geo.ho(), wo = geo.wo(), rows = geo.col_rows();
  std::vector<float> gx(static_cast<std::size_t>(k.n * k.c * k.h * k.w));
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t b = 0; b < k.n; ++b)
    for (std::int64_t c = 0; c < k.c; ++c)
      for (std::int64_t ih = 0; ih < k.h; ++ih)
        for (std::int64_t iw = 0; iw < k.w; ++iw) {
          float sum = 0.0f;
          for (std::int64_t ki = 0; ki < k.kernel; ++ki)
            for (std::int64_t kj = 0; kj < k.kernel; ++kj) {
              const std::int64_t oh_s = ih + k.pad - ki, ow_s = iw + k.pad - kj;
              if (oh_s < 0 || ow_s < 0 || oh_s % k.stride != 0 || ow_s % k.stride != 0) continue;
              const std::int64_t oh = oh_s / k.stride, ow = ow_s / k.stride;
              if (oh >= ho || ow >= wo) continue;
              float entry = 0.0f;
              for (std::int64_t o = 0; o < k.o; ++o)
                entry = std::fma(w[at(o * rows + (c * k.kernel + ki) * k.kernel + kj)],
                                 g[at(((b * k.o + o) * ho + oh) * wo + ow)], entry);
              sum += entry;
            }
          gx[at(((b * k.c + c) * k.h + ih) * k.w + iw)] = sum;
        }
  return gx;
}

}  // namespace

TEST_CASE("cuda conv_forward_implicit sums each output's column rows in order and rounds it once",
          "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  // Every tile over the channels (16, 32, 64 and more than one of 64), masked channels and positions,
  // column rows that do not fill the last slice of 8 (C·k² = 27, 50, 2, 12), stride and padding, 1×1,
  // more positions than one block's tile.
  const std::vector<Case> cases = {
      {2, 3, 7, 6, 4, 3, 1, 1},   {2, 2, 9, 9, 3, 3, 2, 0},    {1, 3, 8, 5, 17, 2, 2, 1},
      {3, 1, 5, 5, 2, 1, 1, 0},   {1, 2, 6, 7, 33, 5, 1, 2},   {2, 2, 11, 10, 70, 5, 3, 2},
      {4, 16, 12, 12, 16, 3, 1, 1}, {3, 5, 9, 9, 64, 3, 2, 1}, {2, 8, 6, 6, 130, 1, 1, 0},
      {2, 3, 4, 5, 6, 2, 1, 4}};  // padding wider than the kernel: whole rows and columns of zeros
  Rng rng(21);
  for (const Case& k : cases) {
    INFO("input [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "], " << k.o << " filters "
                   << k.kernel << "x" << k.kernel << ", stride " << k.stride << ", padding " << k.pad);
    const cuda::ConvGeometry geo{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
    const std::vector<float> x = normals(static_cast<std::size_t>(k.n * k.c * k.h * k.w), rng);
    const std::vector<float> w = normals(static_cast<std::size_t>(k.o * geo.col_rows()), rng, 0.3);
    const std::vector<float> bias = normals(static_cast<std::size_t>(k.o), rng);
    const auto y_size = static_cast<std::size_t>(k.n * k.o * geo.ho() * geo.wo());
    auto d_x = test::to_device(x, ctx);
    auto d_w = test::to_device(w, ctx);
    auto d_b = test::to_device(bias, ctx);
    for (const Format f : {Format::fp32, Format::fp16, Format::bf16, Format::fp8_e5m2})
      for (const bool with_bias : {false, true}) {
        INFO(format_name(f) << (with_bias ? ", with bias" : ", no bias"));
        auto d_y = test::sentinel_buffer<float>(y_size, ctx);
        cuda::conv_forward_implicit(d_x.data(), geo, d_w.data(), k.o, with_bias ? d_b.data() : nullptr, d_y.data(),
                                    cuda::device_rounding(f), ctx.stream());
        CHECK(bit_mismatches(test::to_host(d_y, ctx), reference(k, x, w, with_bias ? &bias : nullptr, f)).empty());
      }
  }
}

TEST_CASE("cuda conv_forward_implicit: column rows past C·k² read nothing, not even past the end of x",
          "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  // C·k² = 4 and 9: the last slice of 8 column rows runs past K. With padding wider than the kernel, the
  // windows of the last output rows pass the bounds check for such a row; its gather must read nothing.
  // The products skip those rows, so a stray read changes no value: one sample of one channel in a
  // buffer of exactly its size makes such a read land past the end of x, where the CPU execution
  // target's AddressSanitizer build (GRADSCALE_CUDA_ON_CPU_ASAN) reports it.
  for (const Case& k : {Case{1, 1, 4, 5, 3, 2, 1, 4}, Case{1, 1, 5, 5, 4, 3, 1, 5}}) {
    INFO("input [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "], " << k.o << " filters "
                   << k.kernel << "x" << k.kernel << ", padding " << k.pad);
    const cuda::ConvGeometry geo{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
    Rng rng(29);
    const std::vector<float> x = normals(static_cast<std::size_t>(k.n * k.c * k.h * k.w), rng);
    const std::vector<float> w = normals(static_cast<std::size_t>(k.o * geo.col_rows()), rng, 0.3);
    auto d_x = test::to_device(x, ctx);
    auto d_w = test::to_device(w, ctx);
    auto d_y = test::sentinel_buffer<float>(static_cast<std::size_t>(k.n * k.o * geo.ho() * geo.wo()), ctx);
    cuda::conv_forward_implicit(d_x.data(), geo, d_w.data(), k.o, nullptr, d_y.data(),
                                cuda::device_rounding(Format::fp32), ctx.stream());
    CHECK(bit_mismatches(test::to_host(d_y, ctx), reference(k, x, w, nullptr, Format::fp32)).empty());
  }
}

TEST_CASE("cuda conv_backward_input_implicit sums each input element's taps as gemm + col2im do",
          "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  // Channels that do not fill a thread's 8, output channels over more than one slice of 64 (70, 130),
  // strides whose taps skip positions, a kernel larger than the stride, 1×1, more positions than a block.
  const std::vector<Case> cases = {
      {2, 3, 7, 6, 4, 3, 1, 1},    {2, 2, 9, 9, 3, 3, 2, 0},     {1, 3, 8, 5, 17, 2, 2, 1},
      {3, 1, 5, 5, 2, 1, 1, 0},    {1, 12, 6, 7, 70, 5, 1, 2},   {2, 2, 11, 10, 5, 5, 3, 2},
      {4, 16, 12, 12, 16, 3, 1, 1}, {3, 9, 9, 9, 130, 3, 2, 1},  {2, 8, 6, 6, 24, 1, 2, 0},
      {2, 3, 4, 5, 6, 2, 1, 4}};  // padding wider than the kernel
  Rng rng(23);
  for (const Case& k : cases) {
    INFO("input [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "], " << k.o << " filters "
                   << k.kernel << "x" << k.kernel << ", stride " << k.stride << ", padding " << k.pad);
    const cuda::ConvGeometry geo{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
    const std::vector<float> g = normals(static_cast<std::size_t>(k.n * k.o * geo.ho() * geo.wo()), rng);
    const std::vector<float> w = normals(static_cast<std::size_t>(k.o * geo.col_rows()), rng, 0.3);
    auto d_g = test::to_device(g, ctx);
    auto d_w = test::to_device(w, ctx);
    auto d_gx = test::sentinel_buffer<float>(static_cast<std::size_t>(k.n * k.c * k.h * k.w), ctx);
    cuda::conv_backward_input_implicit(d_g.data(), geo, d_w.data(), k.o, d_gx.data(), ctx.stream());
    CHECK(bit_mismatches(test::to_host(d_gx, ctx), upstream_reference(k, g, w)).empty());
  }
}

TEST_CASE("cuda conv_forward_implicit equals Conv2d's forward pass with bias on exact values", "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<Case> cases = {{2, 3, 7, 6, 4, 3, 1, 1}, {2, 2, 9, 9, 20, 3, 2, 0}, {1, 2, 6, 7, 40, 5, 1, 2}};
  Rng rng(22);
  for (const Case& k : cases) {
    INFO("input [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "], " << k.o << " filters "
                   << k.kernel << "x" << k.kernel << ", stride " << k.stride << ", padding " << k.pad);
    const cuda::ConvGeometry geo{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
    Rng init_rng(9);
    Conv2d conv("conv", k.c, k.o, k.kernel, k.stride, k.pad, true, InitSpec{}, init_rng);
    conv.set_id(0);
    Parameter& weight = *conv.parameters()[0];
    Parameter& bias = *conv.parameters()[1];
    // Multiples of 1/8 and 1/4 of small integers: every product and sum is exact in fp32 and fp16.
    const auto grid = [&rng](std::size_t n, double unit) {
      std::vector<float> v(n);
      for (float& e : v) e = static_cast<float>(unit * (static_cast<int>(uniform_below(rng, 17)) - 8));
      return v;
    };
    const std::vector<float> w = grid(static_cast<std::size_t>(weight.value.size()), 0.125);
    const std::vector<float> b = grid(static_cast<std::size_t>(bias.value.size()), 0.25);
    std::copy(w.begin(), w.end(), weight.value.data());
    std::copy(b.begin(), b.end(), bias.value.data());
    const std::vector<float> x = grid(static_cast<std::size_t>(k.n * k.c * k.h * k.w), 0.25);
    CpuRun cpu;
    cpu.precision.format = Format::fp16;
    conv.prepare_weights(cpu.precision);
    const Tensor y = cpu.forward(conv, tensor_of({k.n, k.c, k.h, k.w}, x));

    auto d_x = test::to_device(x, ctx);
    auto d_w = test::to_device(w, ctx);
    auto d_b = test::to_device(b, ctx);
    auto d_y = test::sentinel_buffer<float>(static_cast<std::size_t>(y.size()), ctx);
    cuda::conv_forward_implicit(d_x.data(), geo, d_w.data(), k.o, d_b.data(), d_y.data(),
                                cuda::device_rounding(Format::fp16), ctx.stream());
    CHECK(bit_mismatches(test::to_host(d_y, ctx), values(y)).empty());
    // The upstream product of Conv2d's backward pass: exact in fp32 on both sides, then rounded to fp16
    // (the CPU's one rounding at scale 1; the kernel's output is the product before it).
    const std::vector<float> g = grid(static_cast<std::size_t>(y.size()), 0.25);
    const Tensor gx = cpu.backward(conv, tensor_of({k.n, k.c, k.h, k.w}, x), y, tensor_of(y.shape(), g));
    REQUIRE(std::any_of(gx.data(), gx.data() + gx.size(), [](float v) { return v != 0.0f; }));
    auto d_g = test::to_device(g, ctx);
    auto d_gx = test::sentinel_buffer<float>(x.size(), ctx);
    cuda::conv_backward_input_implicit(d_g.data(), geo, d_w.data(), k.o, d_gx.data(), ctx.stream());
    std::vector<float> product = test::to_host(d_gx, ctx);
    for (float& v : product) v = quantize(v, Format::fp16);
    CHECK(bit_mismatches(product, values(gx)).empty());
  }
}

TEST_CASE("cuda's implicit convolutions refuse geometry they cannot index, by name", "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  float none = 0;
  const cuda::DeviceRounding r = cuda::device_rounding(Format::fp16);
  const cuda::ConvGeometry huge{1, 1, std::int64_t{1} << 31, 1, 1, 1, 0};
  CHECK_THROWS_WITH(cuda::conv_forward_implicit(&none, huge, &none, 4, nullptr, &none, r, ctx.stream()),
                    Catch::Matchers::Contains("conv_forward_implicit") && Catch::Matchers::Contains("32-bit indices"));
  const cuda::ConvGeometry misfit{1, 1, 2, 2, 5, 1, 0};
  CHECK_THROWS_WITH(cuda::conv_forward_implicit(&none, misfit, &none, 4, nullptr, &none, r, ctx.stream()),
                    Catch::Matchers::Contains("do not fit input"));
  const cuda::ConvGeometry fine{1, 1, 4, 4, 3, 1, 1};
  CHECK_THROWS_WITH(cuda::conv_forward_implicit(&none, fine, &none, 0, nullptr, &none, r, ctx.stream()),
                    Catch::Matchers::Contains("0 output channels"));
  CHECK_THROWS_WITH(cuda::conv_forward_implicit(nullptr, fine, &none, 4, nullptr, &none, r, ctx.stream()),
                    Catch::Matchers::Contains("null pointer"));
  CHECK_THROWS_WITH(cuda::conv_backward_input_implicit(&none, huge, &none, 4, &none, ctx.stream()),
                    Catch::Matchers::Contains("conv_backward_input_implicit") &&
                        Catch::Matchers::Contains("32-bit indices"));
  CHECK_THROWS_WITH(cuda::conv_backward_input_implicit(&none, fine, &none, -1, &none, ctx.stream()),
                    Catch::Matchers::Contains("-1 output channels"));
  CHECK_THROWS_WITH(cuda::conv_backward_input_implicit(&none, fine, nullptr, 4, &none, ctx.stream()),
                    Catch::Matchers::Contains("null pointer"));
}
