// Tests of lib/cuda's ReLU, max pooling and convolution kernels against the CPU layers (lib/layers) on
// small shapes (built only with CUDA; every case skips visibly without a GPU): ReLU, max pooling (2×2
// fast path, overlapping and generic windows, ties, NaN), im2col/col2im and a convolution through them
// and cuBLAS give the CPU's bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/random.h"
#include "lib/cuda/adam.h"
#include "lib/cuda/batchnorm.h"
#include "lib/cuda/context.h"
#include "lib/cuda/convert.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/maxpool.h"
#include "lib/cuda/optim_step.h"
#include "lib/cuda/relu.h"
#include "lib/cuda/sgd.h"
#include "lib/cuda/softmax_cross_entropy.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/pool.h"
#include "lib/layers/relu.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scaler.h"
#include "tests/cuda_layers_fixtures.h"
#include "tests/cuda_test.h"

using namespace gradscale;
using test::bit_mismatches;
using namespace gradscale::test::cuda_layers_fixtures;

namespace {

// k·unit with k uniform in [lo, hi]: exact, and every sum the tests form stays exact.
std::vector<float> grid(std::size_t n, Rng& rng, int lo, int hi, double unit) {
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>(
        unit * (lo + static_cast<int>(uniform_below(rng, static_cast<std::uint64_t>(hi - lo + 1)))));
  return v;
}

bool any_nonzero(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; });
}

}  // namespace

TEST_CASE("cuda relu forward and backward equal the CPU ReLU bit for bit", "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(1);
  std::vector<float> x = normals(10007, rng);
  for (float s : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), 0x1p-149f, -0x1p-149f})
    x.push_back(s);
  const std::vector<float> g = normals(x.size(), rng);
  const Shape shape{static_cast<std::int64_t>(x.size())};
  CpuRun cpu;
  ReLU relu("relu");
  relu.set_id(0);
  const Tensor xt = tensor_of(shape, x);
  const Tensor y = cpu.forward(relu, xt);
  const Tensor gx = cpu.backward(relu, xt, y, tensor_of(shape, g));

  auto d_x = test::to_device(x, ctx);
  auto d_g = test::to_device(g, ctx);
  auto d_y = test::sentinel_buffer<float>(x.size(), ctx);
  auto d_gx = test::sentinel_buffer<float>(x.size(), ctx);
  cuda::relu_forward(d_x.data(), d_y.data(), x.size(), ctx.stream());
  cuda::relu_backward(d_y.data(), d_g.data(), d_gx.data(), x.size(), ctx.stream());
  CHECK(bit_mismatches(test::to_host(d_y, ctx), values(y), &x).empty());
  CHECK(bit_mismatches(test::to_host(d_gx, ctx), values(gx)).empty());
}

TEST_CASE("cuda max pooling equals MaxPool2d bit for bit: 2x2, overlapping and generic windows, ties, NaN",
          "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  struct Case {
    std::int64_t n, c, h, w, kernel, stride;
  };
  const std::vector<Case> cases = {{2, 3, 7, 9, 2, 2}, {2, 3, 8, 8, 2, 2}, {1, 2, 9, 11, 3, 2},
                                   {1, 2, 6, 7, 3, 1}, {2, 1, 5, 5, 2, 1}, {1, 3, 10, 10, 3, 3},
                                   {1, 1, 2, 2, 2, 2}, {1, 1, 5, 4, 1, 1}, {3, 4, 14, 14, 2, 2}};
  Rng rng(2);
  for (const Case& k : cases) {
    INFO("input [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "], kernel " << k.kernel
                   << ", stride " << k.stride);
    const Shape xs{k.n, k.c, k.h, k.w};
    // Few distinct values, so windows have ties; 1% NaN.
    std::vector<float> x = grid(static_cast<std::size_t>(shape_size(xs)), rng, -3, 3, 0.25);
    for (float& v : x)
      if (uniform01(rng) < 0.01) v = std::numeric_limits<float>::quiet_NaN();
    CpuRun cpu;
    MaxPool2d pool("pool", k.kernel, k.stride);
    pool.set_id(0);
    const Tensor xt = tensor_of(xs, x);
    const Tensor y = cpu.forward(pool, xt);
    const std::vector<float> g = grid(static_cast<std::size_t>(y.size()), rng, -8, 8, 0.125);
    const Tensor gx = cpu.backward(pool, xt, y, tensor_of(y.shape(), g));

    const cuda::PoolGeometry geo{k.n * k.c, k.h, k.w, k.kernel, k.stride};
    REQUIRE(geo.ho() == y.dim(2));
    REQUIRE(geo.wo() == y.dim(3));
    auto d_x = test::to_device(x, ctx);
    auto d_g = test::to_device(g, ctx);
    auto d_y = test::sentinel_buffer<float>(static_cast<std::size_t>(y.size()), ctx);
    auto d_arg = test::sentinel_buffer<std::int32_t>(static_cast<std::size_t>(y.size()), ctx);
    auto d_gx = test::sentinel_buffer<float>(x.size(), ctx);
    cuda::max_pool_forward(d_x.data(), geo, d_y.data(), d_arg.data(), ctx.stream());
    cuda::max_pool_backward(d_g.data(), d_arg.data(), geo, d_gx.data(), ctx.stream());
    CHECK(bit_mismatches(test::to_host(d_y, ctx), values(y)).empty());
    CHECK(bit_mismatches(test::to_host(d_gx, ctx), values(gx)).empty());
    // argmax: the first maximum in row-major order, a NaN winning (pool.h), checked independently.
    const std::vector<std::int32_t> arg = test::to_host(d_arg, ctx);
    const std::int64_t ho = geo.ho(), wo = geo.wo();
    std::size_t bad = 0;
    for (std::int64_t p = 0; p < geo.planes; ++p)
      for (std::int64_t oh = 0; oh < ho; ++oh)
        for (std::int64_t ow = 0; ow < wo; ++ow) {
          std::int64_t best_i = -1;
          for (std::int64_t ki = 0; ki < k.kernel && best_i < 0; ++ki)
            for (std::int64_t kj = 0; kj < k.kernel; ++kj) {
              const std::int64_t i = (oh * k.stride + ki) * k.w + ow * k.stride + kj;
              if (std::isnan(x[static_cast<std::size_t>(p * k.h * k.w + i)])) {
                best_i = i;
                break;
              }
            }
          if (best_i < 0) {
            float best = -std::numeric_limits<float>::infinity();
            for (std::int64_t ki = 0; ki < k.kernel; ++ki)
              for (std::int64_t kj = 0; kj < k.kernel; ++kj) {
                const std::int64_t i = (oh * k.stride + ki) * k.w + ow * k.stride + kj;
                const float v = x[static_cast<std::size_t>(p * k.h * k.w + i)];
                if (best_i < 0 || v > best) best = v, best_i = i;
              }
          }
          bad += arg[static_cast<std::size_t>((p * ho + oh) * wo + ow)] != best_i;
        }
    CHECK(bad == 0);
  }
}

TEST_CASE(
    "cuda im2col and col2im equal the direct formulas, and a convolution through them and cuBLAS equals "
    "Conv2d",
    "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  struct Case {
    std::int64_t n, c, h, w, o, kernel, stride, pad;
  };
  const std::vector<Case> cases = {
      {2, 3, 7, 6, 4, 3, 1, 1}, {2, 2, 9, 9, 3, 3, 2, 0},  {1, 3, 8, 5, 2, 2, 2, 1}, {3, 1, 5, 5, 2, 1, 1, 0},
      {1, 2, 6, 7, 5, 5, 1, 2}, {2, 2, 11, 10, 3, 5, 3, 2}};  // taps overlap at a stride > 1
  Rng rng(4);
  for (const Case& k : cases) {
    INFO("input [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "], " << k.o << " filters "
                   << k.kernel << "x" << k.kernel << ", stride " << k.stride << ", padding " << k.pad);
    const cuda::ConvGeometry geo{k.n, k.c, k.h, k.w, k.kernel, k.stride, k.pad};
    const std::int64_t rows = geo.col_rows(), plane = geo.col_cols(), ho = geo.ho(), wo = geo.wo();
    const Shape xs{k.n, k.c, k.h, k.w};
    const std::vector<float> x = grid(static_cast<std::size_t>(shape_size(xs)), rng, -8, 8, 0.25);
    auto d_x = test::to_device(x, ctx);

    // im2col against the formula; col2im against the CPU's scatter order (c, ki, kj, oh, ow) on
    // arbitrary (inexact) values: the same additions in the same order.
    auto d_cols = test::sentinel_buffer<float>(static_cast<std::size_t>(k.n * rows * plane), ctx);
    cuda::im2col(d_x.data(), geo, d_cols.data(), ctx.stream());
    std::vector<float> cols_ref(static_cast<std::size_t>(k.n * rows * plane));
    for (std::int64_t b = 0; b < k.n; ++b)
      for (std::int64_t c = 0; c < k.c; ++c)
        for (std::int64_t ki = 0; ki < k.kernel; ++ki)
          for (std::int64_t kj = 0; kj < k.kernel; ++kj)
            for (std::int64_t oh = 0; oh < ho; ++oh)
              for (std::int64_t ow = 0; ow < wo; ++ow) {
                const std::int64_t ih = oh * k.stride - k.pad + ki, iw = ow * k.stride - k.pad + kj;
                const bool in = ih >= 0 && ih < k.h && iw >= 0 && iw < k.w;
                cols_ref[static_cast<std::size_t>(((b * rows) + (c * k.kernel + ki) * k.kernel + kj) * plane +
                                                  oh * wo + ow)] =
                    in ? x[static_cast<std::size_t>(((b * k.c + c) * k.h + ih) * k.w + iw)] : 0.0f;
              }
    CHECK(bit_mismatches(test::to_host(d_cols, ctx), cols_ref).empty());
    const std::vector<float> col_grad = normals(cols_ref.size(), rng);
    std::vector<float> gx_ref(x.size(), 0.0f);
    for (std::int64_t b = 0; b < k.n; ++b)
      for (std::int64_t c = 0; c < k.c; ++c)
        for (std::int64_t ki = 0; ki < k.kernel; ++ki)
          for (std::int64_t kj = 0; kj < k.kernel; ++kj)
            for (std::int64_t oh = 0; oh < ho; ++oh)
              for (std::int64_t ow = 0; ow < wo; ++ow) {
                const std::int64_t ih = oh * k.stride - k.pad + ki, iw = ow * k.stride - k.pad + kj;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                gx_ref[static_cast<std::size_t>(((b * k.c + c) * k.h + ih) * k.w + iw)] +=
                    col_grad[static_cast<std::size_t>(
                        ((b * rows) + (c * k.kernel + ki) * k.kernel + kj) * plane + oh * wo + ow)];
              }
    auto d_col_grad = test::to_device(col_grad, ctx);
    auto d_gx = test::sentinel_buffer<float>(x.size(), ctx);
    cuda::col2im(d_col_grad.data(), geo, d_gx.data(), ctx.stream());
    CHECK(bit_mismatches(test::to_host(d_gx, ctx), gx_ref).empty());

    // The batch-wide layout: sample b's columns side by side at b·Ho·Wo in rows of n·Ho·Wo; the same
    // entries, and col2im from it sums in the same order.
    std::vector<float> wide_ref(cols_ref.size()), col_grad_wide(cols_ref.size());
    for (std::int64_t b = 0; b < k.n; ++b)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t q = 0; q < plane; ++q) {
          const auto from = static_cast<std::size_t>((b * rows + r) * plane + q);
          const auto to = static_cast<std::size_t>(r * k.n * plane + b * plane + q);
          wide_ref[to] = cols_ref[from];
          col_grad_wide[to] = col_grad[from];
        }
    auto d_wide = test::sentinel_buffer<float>(cols_ref.size(), ctx);
    cuda::im2col(d_x.data(), geo, d_wide.data(), ctx.stream(), cuda::ColumnLayout::batch_wide);
    CHECK(bit_mismatches(test::to_host(d_wide, ctx), wide_ref).empty());
    auto d_col_grad_wide = test::to_device(col_grad_wide, ctx);
    auto d_gx_wide = test::sentinel_buffer<float>(x.size(), ctx);
    cuda::col2im(d_col_grad_wide.data(), geo, d_gx_wide.data(), ctx.stream(), cuda::ColumnLayout::batch_wide);
    CHECK(bit_mismatches(test::to_host(d_gx_wide, ctx), gx_ref).empty());

    // The columns written as a GEMM's 16-bit operand (the convolution's path when its GEMMs read fp16
    // or bf16): in either layout, the bits of convert.h's conversion of the fp32 columns.
    for (const cuda::DeviceType t : {cuda::DeviceType::f16, cuda::DeviceType::bf16})
      for (const auto layout : {cuda::ColumnLayout::per_sample, cuda::ColumnLayout::batch_wide}) {
        INFO(cuda::device_type_name(t) << (layout == cuda::ColumnLayout::batch_wide ? ", batch-wide" : ""));
        const float* fp32 = layout == cuda::ColumnLayout::batch_wide ? d_wide.data() : d_cols.data();
        cuda::DeviceBuffer<std::uint16_t> expected(cols_ref.size());
        if (t == cuda::DeviceType::f16)
          cuda::to_fp16(fp32, reinterpret_cast<__half*>(expected.data()), cols_ref.size(), ctx.stream());
        else
          cuda::to_bf16(fp32, reinterpret_cast<__nv_bfloat16*>(expected.data()), cols_ref.size(), ctx.stream());
        auto d16 = test::sentinel_buffer<std::uint16_t>(cols_ref.size(), ctx);
        cuda::im2col_16bit(d_x.data(), geo, d16.data(), t, ctx.stream(), layout);
        CHECK(test::to_host(d16, ctx) == test::to_host(expected, ctx));
      }

    // The convolution of Conv2d (no bias) on exact values: y_b = W·cols_b; the upstream gradient
    // col2im(Wᵀ·g_b); the weight gradient Σ_b g_b·cols_bᵀ. Every sum is exact, so the bits must match.
    Rng init_rng(9);
    Conv2d conv("conv", k.c, k.o, k.kernel, k.stride, k.pad, false, InitSpec{}, init_rng);
    conv.set_id(0);
    Parameter& weight = *conv.parameters()[0];
    const std::vector<float> w = grid(static_cast<std::size_t>(weight.value.size()), rng, -8, 8, 0.125);
    std::copy(w.begin(), w.end(), weight.value.data());
    weight.grad.fill(0.0f);
    CpuRun cpu;
    conv.prepare_weights(cpu.precision);
    const Tensor xt = tensor_of(xs, x);
    const Tensor y = cpu.forward(conv, xt);
    const std::vector<float> g = grid(static_cast<std::size_t>(y.size()), rng, -4, 4, 0.25);
    const Tensor gx = cpu.backward(conv, xt, y, tensor_of(y.shape(), g));
    REQUIRE(any_nonzero(values(y)));
    REQUIRE(any_nonzero(values(gx)));

    auto d_w = test::to_device(w, ctx);
    auto d_y = test::sentinel_buffer<float>(static_cast<std::size_t>(y.size()), ctx);
    cuda::gemm(ctx, k.o, plane, rows, 1.0f, {d_w.data(), cuda::DeviceType::f32, false, 0},
               {d_cols.data(), cuda::DeviceType::f32, false, rows * plane}, 0.0f,
               {d_y.data(), cuda::DeviceType::f32, k.o * plane}, k.n);
    CHECK(bit_mismatches(test::to_host(d_y, ctx), values(y)).empty());

    auto d_g = test::to_device(g, ctx);
    auto d_grad_cols = test::sentinel_buffer<float>(cols_ref.size(), ctx);
    cuda::gemm(ctx, rows, plane, k.o, 1.0f, {d_w.data(), cuda::DeviceType::f32, true, 0},
               {d_g.data(), cuda::DeviceType::f32, false, k.o * plane}, 0.0f,
               {d_grad_cols.data(), cuda::DeviceType::f32, rows * plane}, k.n);
    auto d_conv_gx = test::sentinel_buffer<float>(x.size(), ctx);
    cuda::col2im(d_grad_cols.data(), geo, d_conv_gx.data(), ctx.stream());
    CHECK(bit_mismatches(test::to_host(d_conv_gx, ctx), values(gx)).empty());

    auto d_grad_w = test::sentinel_buffer<float>(w.size(), ctx);
    for (std::int64_t b = 0; b < k.n; ++b)
      cuda::gemm(ctx, k.o, rows, plane, 1.0f, {d_g.data() + b * k.o * plane, cuda::DeviceType::f32, false, 0},
                 {d_cols.data() + b * rows * plane, cuda::DeviceType::f32, true, 0}, b == 0 ? 0.0f : 1.0f,
                 {d_grad_w.data(), cuda::DeviceType::f32, 0});
    CHECK(bit_mismatches(test::to_host(d_grad_w, ctx), values(weight.grad)).empty());
  }
  // Geometry the kernels cannot index, or a kernel larger than the padded input: refused by name,
  // before anything is launched.
  float none = 0;
  const cuda::ConvGeometry huge{1, 1, std::int64_t{1} << 31, 1, 1, 1, 0};
  CHECK_THROWS_WITH(cuda::im2col(&none, huge, &none, ctx.stream()),
                    Catch::Matchers::Contains("32-bit indices"));
  CHECK_THROWS_WITH(cuda::col2im(&none, huge, &none, ctx.stream()),
                    Catch::Matchers::Contains("32-bit indices"));
  const cuda::ConvGeometry misfit{1, 1, 2, 2, 5, 1, 0};
  CHECK_THROWS_WITH(cuda::im2col(&none, misfit, &none, ctx.stream()),
                    Catch::Matchers::Contains("do not fit input"));
}
