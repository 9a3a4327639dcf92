// Tests of lib/cuda's layer and optimizer kernels against the CPU layers (lib/layers) and optimizers
// (lib/optim) on small shapes (built only with CUDA; every case skips visibly without a GPU):
//  - ReLU, max pooling (2×2 fast path, overlapping and generic windows, ties, NaN), im2col/col2im and a
//    convolution through them and cuBLAS: the CPU's bits;
//  - BatchNorm (training and eval, 1d and 2d) and softmax cross-entropy with a loss scale: within one
//    fp32 ulp of the CPU (sums in another order; CUDA's exp/log), tolerances stated at each check;
//  - SGD and Adam over several steps with skipped steps decided on the device from the found_inf flag:
//    the CPU's weights and state, and the CPU's step count.
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
#include "tests/cuda_test.h"

using namespace gradscale;
using test::bit_mismatches;

namespace {

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data(), t.data() + t.size());
}

Tensor tensor_of(const Shape& s, const std::vector<float>& v) {
  Tensor t(s);
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

std::vector<float> normals(std::size_t n, Rng& rng, double sigma = 1.0, double mean = 0.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + sigma * standard_normal(rng));
  return v;
}

// k·unit with k uniform in [lo, hi]: exact, and every sum the tests form stays exact.
std::vector<float> grid(std::size_t n, Rng& rng, int lo, int hi, double unit) {
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>(
        unit * (lo + static_cast<int>(uniform_below(rng, static_cast<std::uint64_t>(hi - lo + 1)))));
  return v;
}

// One CPU layer run at fp32 precision with a global policy (local scale 1), as the engine runs it.
struct CpuRun {
  Precision precision;
  std::unique_ptr<Scaler> scaler = make_scaler(nlohmann::json{{"policy", "none"}}, Format::fp32);
  StepMonitor monitor;
  CpuRun() { monitor.reset(1, false, 0.0); }
  Tensor forward(Layer& layer, const Tensor& x, bool training = true) {
    ForwardContext ctx{precision, training, nullptr};
    Tensor y;
    layer.forward({&x}, y, ctx);
    return y;
  }
  Tensor backward(Layer& layer, const Tensor& x, const Tensor& y, const Tensor& g) {
    ScaledGrad gy{g, 1.0}, gx;
    BackwardContext ctx{precision, *scaler, monitor};
    layer.backward({&x}, y, gy, {&gx}, ctx);
    return gx.g;
  }
};

// |gpu − cpu| ≤ 2^-23·|cpu| + 1e-11·max|cpu|: one fp32 rounding apart (a double result rounded to
// float once, from double sums added in another order), plus double-level noise where terms cancel.
std::string ulp_mismatches(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size()) return "sizes differ";
  double scale = 0;
  for (float x : cpu) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  std::size_t bad = 0;
  std::ostringstream os;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double tol = 0x1p-23 * std::fabs(static_cast<double>(cpu[i])) + 1e-11 * scale;
    if (std::fabs(static_cast<double>(gpu[i]) - cpu[i]) <= tol) continue;
    if (++bad <= 8) os << "  [" << i << "] got " << gpu[i] << " want " << cpu[i] << "\n";
  }
  return bad == 0 ? "" : std::to_string(bad) + " of " + std::to_string(cpu.size()) + " differ:\n" + os.str();
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
  const std::vector<Case> cases = {{2, 3, 7, 6, 4, 3, 1, 1},
                                   {2, 2, 9, 9, 3, 3, 2, 0},
                                   {1, 3, 8, 5, 2, 2, 2, 1},
                                   {3, 1, 5, 5, 2, 1, 1, 0},
                                   {1, 2, 6, 7, 5, 5, 1, 2}};
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
}

TEST_CASE("cuda batch norm matches BatchNorm within one fp32 ulp (training and eval, 1d and 2d)",
          "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(6);
  // A channel's sums spread over one block per 2048 values (at most 64): the first two shapes take one
  // block per channel, the others 3, 5 and 32 (64 on a GPU).
  const std::int64_t many = test::gpu_or_cpu_target<std::int64_t>(160, 72);
  for (const Shape& xs : {Shape{6, 4}, Shape{3, 5, 4, 7}, Shape{4100, 3}, Shape{40, 3, 16, 16},
                          Shape{many, 2, 30, 30}}) {
    const std::int64_t channels = xs[1], plane = xs.size() == 4 ? xs[2] * xs[3] : 1;
    const cuda::BatchNormShape s{xs[0], channels, plane};
    const std::vector<float> x = normals(static_cast<std::size_t>(shape_size(xs)), rng, 2.0, 3.0);
    BatchNorm bn("bn", channels);
    bn.set_id(0);
    const std::vector<float> gamma = normals(static_cast<std::size_t>(channels), rng, 0.2, 1.0);
    const std::vector<float> beta = normals(static_cast<std::size_t>(channels), rng, 0.5);
    std::copy(gamma.begin(), gamma.end(), bn.parameters()[0]->value.data());
    std::copy(beta.begin(), beta.end(), bn.parameters()[1]->value.data());
    CpuRun cpu;
    bn.prepare_weights(cpu.precision);
    auto d_x = test::to_device(x, ctx);
    auto d_gamma = test::to_device(gamma, ctx);
    auto d_beta = test::to_device(beta, ctx);
    auto d_rmean = test::to_device(std::vector<float>(static_cast<std::size_t>(channels), 0.0f), ctx);
    auto d_rvar = test::to_device(std::vector<float>(static_cast<std::size_t>(channels), 1.0f), ctx);
    cuda::DeviceBuffer<double> d_mean(static_cast<std::size_t>(channels)),
        d_invstd(static_cast<std::size_t>(channels));
    const Tensor xt = tensor_of(xs, x);

    for (bool training : {true, false}) {
      INFO("input " << shape_string(xs) << (training ? ", training" : ", eval"));
      if (!training) {  // eval normalises with the running statistics: start both sides from the CPU's
        d_rmean.upload(bn.buffers()[0].second->data(), static_cast<std::size_t>(channels), ctx.stream());
        d_rvar.upload(bn.buffers()[1].second->data(), static_cast<std::size_t>(channels), ctx.stream());
      }
      const Tensor y = cpu.forward(bn, xt, training);
      auto d_y = test::sentinel_buffer<float>(x.size(), ctx);
      if (training)
        cuda::batchnorm_forward_training(ctx, d_x.data(), s, d_gamma.data(), d_beta.data(), 1e-5, 0.1,
                                         d_rmean.data(), d_rvar.data(), d_mean.data(), d_invstd.data(),
                                         d_y.data());
      else
        cuda::batchnorm_forward_eval(d_x.data(), s, d_gamma.data(), d_beta.data(), d_rmean.data(),
                                     d_rvar.data(), 1e-5, d_mean.data(), d_invstd.data(), d_y.data(),
                                     ctx.stream());
      CHECK(ulp_mismatches(test::to_host(d_y, ctx), values(y)).empty());
      if (training) {
        CHECK(ulp_mismatches(test::to_host(d_rmean, ctx), values(*bn.buffers()[0].second)).empty());
        CHECK(ulp_mismatches(test::to_host(d_rvar, ctx), values(*bn.buffers()[1].second)).empty());
      }

      const std::vector<float> g = normals(x.size(), rng);
      for (Parameter* p : bn.parameters()) p->grad.fill(0.0f);
      const Tensor gx = cpu.backward(bn, xt, y, tensor_of(xs, g));
      auto d_g = test::to_device(g, ctx);
      auto d_gx = test::sentinel_buffer<float>(x.size(), ctx);
      auto d_dgamma = test::sentinel_buffer<float>(static_cast<std::size_t>(channels), ctx);
      auto d_dbeta = test::sentinel_buffer<float>(static_cast<std::size_t>(channels), ctx);
      cuda::batchnorm_backward(ctx, d_x.data(), d_g.data(), s, d_gamma.data(), d_mean.data(), d_invstd.data(),
                               training, d_gx.data(), d_dgamma.data(), d_dbeta.data());
      CHECK(ulp_mismatches(test::to_host(d_gx, ctx), values(gx)).empty());
      CHECK(ulp_mismatches(test::to_host(d_dgamma, ctx), values(bn.parameters()[0]->grad)).empty());
      CHECK(ulp_mismatches(test::to_host(d_dbeta, ctx), values(bn.parameters()[1]->grad)).empty());
    }
  }
}

TEST_CASE("cuda softmax cross-entropy matches the CPU loss and its scaled gradient", "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(8);
  const std::int64_t n = 37, classes = 10;
  std::vector<float> logits = normals(static_cast<std::size_t>(n * classes), rng, 3.0);
  for (float& z : logits) z = quantize(z, Format::fp16);  // logits are values in F
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (auto& y : labels) y = static_cast<std::int32_t>(uniform_below(rng, classes));
  const Tensor lt = tensor_of({n, classes}, logits);
  auto d_logits = test::to_device(logits, ctx);
  auto d_labels = test::to_device(labels, ctx);
  cuda::DeviceBuffer<cuda::DeviceLoss> d_loss(1);

  for (double loss_scale : {1.0, 1024.0, 3.0}) {
    INFO("loss scale " << loss_scale);
    Tensor grad;
    const LossResult cpu = softmax_cross_entropy_fp32(lt, labels.data(), loss_scale, &grad);
    auto d_grad = test::sentinel_buffer<float>(logits.size(), ctx);
    cuda::softmax_cross_entropy(ctx, d_logits.data(), d_labels.data(), n, classes, loss_scale, d_grad.data(),
                                d_loss.data());
    const cuda::DeviceLoss loss = test::to_host(d_loss, ctx)[0];
    CHECK(loss.bad_labels == 0);
    CHECK(loss.correct == cpu.correct);
    // exp/log within an ulp in double: the mean loss to 1e-12 relative.
    CHECK(std::fabs(loss.loss_sum / static_cast<double>(n) - cpu.loss) <= 1e-12 * (1 + std::fabs(cpu.loss)));
    // The float probability may round one ulp apart (≤ 2^-24 absolute, as p ≤ 1), and p − onehot and the
    // product with float(S0/N) round once more each: |Δg| ≤ 2^-22·S0/N + 2^-23·|g|.
    const std::vector<float> got = test::to_host(d_grad, ctx);
    const double scale_over_n = loss_scale / static_cast<double>(n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double tol = 0x1p-22 * scale_over_n +
                         0x1p-23 * std::fabs(static_cast<double>(grad[static_cast<std::int64_t>(i)]));
      bad += !(std::fabs(static_cast<double>(got[i]) - grad[static_cast<std::int64_t>(i)]) <= tol);
    }
    CHECK(bad == 0);
  }

  // Labels outside [0, classes) are counted, give a NaN loss and a zero gradient row; no gradient wanted.
  std::vector<std::int32_t> bad_labels = labels;
  bad_labels[3] = -1;
  bad_labels[20] = static_cast<std::int32_t>(classes);
  auto d_bad = test::to_device(bad_labels, ctx);
  auto d_grad = test::sentinel_buffer<float>(logits.size(), ctx);
  cuda::softmax_cross_entropy(ctx, d_logits.data(), d_bad.data(), n, classes, 1.0, d_grad.data(),
                              d_loss.data());
  const cuda::DeviceLoss loss = test::to_host(d_loss, ctx)[0];
  CHECK(loss.bad_labels == 2);
  CHECK(std::isnan(loss.loss_sum));
  const std::vector<float> got = test::to_host(d_grad, ctx);
  for (std::int64_t k = 0; k < classes; ++k) {
    CHECK(got[static_cast<std::size_t>(3 * classes + k)] == 0.0f);
    CHECK(got[static_cast<std::size_t>(20 * classes + k)] == 0.0f);
  }
  cuda::softmax_cross_entropy(ctx, d_logits.data(), d_labels.data(), n, classes, 1.0, nullptr, d_loss.data());
  CHECK(test::to_host(d_loss, ctx)[0].bad_labels == 0);
}

namespace {

// Parameters of both sides: the CPU's Parameter objects and device copies of value and gradient.
struct OptimParams {
  std::vector<Parameter> cpu;
  std::vector<cuda::DeviceBuffer<float>> w, g;
  OptimParams(cuda::CudaContext& ctx, Rng& rng) {
    for (std::int64_t n : {1, 1000, 70001}) {  // 70001: the CPU's OpenMP path
      Parameter p;
      p.name = "p" + std::to_string(cpu.size());
      p.value = tensor_of({n}, normals(static_cast<std::size_t>(n), rng));
      p.grad = Tensor({n}, 0.0f);
      p.weight_decay = cpu.size() != 1;  // the second one is excluded from weight decay
      w.push_back(test::to_device(values(p.value), ctx));
      g.push_back(cuda::DeviceBuffer<float>(static_cast<std::size_t>(n)));
      cpu.push_back(std::move(p));
    }
  }
  std::vector<Parameter*> pointers() {
    std::vector<Parameter*> v;
    for (Parameter& p : cpu) v.push_back(&p);
    return v;
  }
  // A new gradient for every parameter, the same on both sides.
  void new_gradients(cuda::CudaContext& ctx, Rng& rng) {
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      const std::vector<float> grad = normals(static_cast<std::size_t>(cpu[i].grad.size()), rng, 0.5);
      std::copy(grad.begin(), grad.end(), cpu[i].grad.data());
      g[i].upload(grad.data(), grad.size(), ctx.stream());
    }
  }
};

// Steps 1..6 with found_inf on steps 3 and 5: the CPU simply does not call step(); the GPU sets the
// device flag and lets optimizer_begin_step decide.
constexpr int kSteps = 6;
bool skipped(int step) {
  return step == 3 || step == 5;
}

}  // namespace

TEST_CASE("cuda SGD equals lib/optim's SGD bit for bit and skips on the device flag", "[cuda][optim]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<nlohmann::json> configs = {{{"name", "sgd"}},
                                               {{"name", "sgd"}, {"momentum", 0.9}},
                                               {{"name", "sgd"}, {"momentum", 0.9}, {"nesterov", true}},
                                               {{"name", "sgd"}, {"momentum", 0.8}, {"weight_decay", 0.01}}};
  for (const nlohmann::json& cfg : configs) {
    INFO(cfg.dump());
    Rng rng(10);
    OptimParams params(ctx, rng);
    auto opt = make_optimizer(cfg);
    const double lr = 0.05, momentum = cfg.value("momentum", 0.0);
    std::vector<cuda::DeviceBuffer<float>> buffers;
    for (const Parameter& p : params.cpu) {
      buffers.emplace_back(momentum > 0 ? static_cast<std::size_t>(p.value.size()) : 0);
      buffers.back().fill_bytes(0, ctx.stream());
    }
    cuda::DeviceBuffer<cuda::DeviceOptimizerStep> step(1);
    step.fill_bytes(0, ctx.stream());
    cuda::DeviceBuffer<int> flag(1);
    for (int t = 1; t <= kSteps; ++t) {
      INFO("step " << t);
      params.new_gradients(ctx, rng);
      if (!skipped(t)) opt->step(params.pointers(), lr);
      const std::vector<int> f = {skipped(t) ? 1 : 0};
      flag.upload(f.data(), 1, ctx.stream());
      cuda::optimizer_begin_step(flag.data(), step.data(), nullptr, ctx.stream());
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        const cuda::SgdParams sp{lr, momentum, cfg.value("nesterov", false),
                                 params.cpu[i].weight_decay ? cfg.value("weight_decay", 0.0) : 0.0};
        cuda::sgd_update(params.w[i].data(), params.g[i].data(), momentum > 0 ? buffers[i].data() : nullptr,
                         params.w[i].size(), sp, step.data(), ctx.stream());
      }
      CHECK(test::to_host(step, ctx)[0].applied == opt->step_count());
      CHECK(test::to_host(step, ctx)[0].current == (skipped(t) ? 0 : opt->step_count()));
      const auto state = opt->state_tensors();
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        INFO("parameter " << i);
        CHECK(bit_mismatches(test::to_host(params.w[i], ctx), values(params.cpu[i].value)).empty());
        if (momentum > 0)
          CHECK(bit_mismatches(test::to_host(buffers[i], ctx), values(*state[i].second)).empty());
      }
    }
  }
}

TEST_CASE(
    "cuda Adam / AdamW equal lib/optim's moments bit for bit and weights to an ulp, and skip on the flag",
    "[cuda][optim]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<nlohmann::json> configs = {
      {{"name", "adam"}},
      {{"name", "adam"}, {"weight_decay", 0.01}},
      {{"name", "adamw"}, {"weight_decay", 0.01}},
      {{"name", "adam"}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}}};
  for (const nlohmann::json& cfg : configs) {
    INFO(cfg.dump());
    Rng rng(12);
    OptimParams params(ctx, rng);
    auto opt = make_optimizer(cfg);
    const nlohmann::json full = opt->config();  // defaults resolved
    const double lr = 1e-3;
    std::vector<cuda::DeviceBuffer<float>> m, v;
    for (const Parameter& p : params.cpu) {
      m.emplace_back(static_cast<std::size_t>(p.value.size()));
      v.emplace_back(static_cast<std::size_t>(p.value.size()));
      m.back().fill_bytes(0, ctx.stream());
      v.back().fill_bytes(0, ctx.stream());
    }
    cuda::DeviceBuffer<cuda::DeviceOptimizerStep> step(1);
    step.fill_bytes(0, ctx.stream());
    cuda::DeviceBuffer<int> flag(1);
    const double beta1 = full["beta1"].get<double>(), beta2 = full["beta2"].get<double>();
    const cuda::AdamSchedule schedule{lr, beta1, beta2};
    for (int t = 1; t <= kSteps; ++t) {
      INFO("step " << t);
      params.new_gradients(ctx, rng);
      std::vector<std::vector<float>> before;  // the weights both sides start the step from
      for (const Parameter& p : params.cpu) before.push_back(values(p.value));
      if (!skipped(t)) opt->step(params.pointers(), lr);
      const std::vector<int> f = {skipped(t) ? 1 : 0};
      flag.upload(f.data(), 1, ctx.stream());
      cuda::optimizer_begin_step(flag.data(), step.data(), &schedule, ctx.stream());
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        const cuda::AdamParams ap{lr,
                                  beta1,
                                  beta2,
                                  full["eps"].get<double>(),
                                  params.cpu[i].weight_decay ? full["weight_decay"].get<double>() : 0.0,
                                  full["name"].get<std::string>() == "adamw"};
        cuda::adam_update(params.w[i].data(), params.g[i].data(), m[i].data(), v[i].data(),
                          params.w[i].size(), ap, step.data(), ctx.stream());
      }
      CHECK(test::to_host(step, ctx)[0].applied == opt->step_count());
      const auto state = opt->state_tensors();  // exp_avg, exp_avg_sq per parameter
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        INFO("parameter " << i);
        CHECK(bit_mismatches(test::to_host(m[i], ctx), values(*state[2 * i].second)).empty());
        CHECK(bit_mismatches(test::to_host(v[i], ctx), values(*state[2 * i + 1].second)).empty());
        // The step's scalars −lr/(1 − beta1^t) and sqrt(1 − beta2^t) come from CUDA's pow (2 ulp in
        // double) and may round to floats one ulp apart: |Δw| ≤ 2^-22·|w − w_before| + one ulp of w.
        const std::vector<float> got = test::to_host(params.w[i], ctx);
        const std::vector<float> want = values(params.cpu[i].value);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          const double moved = std::fabs(static_cast<double>(want[j]) - before[i][j]);
          const double tol = 0x1p-22 * moved + 0x1p-23 * std::fabs(static_cast<double>(want[j]));
          bad += !(std::fabs(static_cast<double>(got[j]) - want[j]) <= tol);
        }
        CHECK(bad == 0);
        if (skipped(t)) CHECK(bit_mismatches(got, before[i]).empty());  // a skipped step changes nothing
        // Both sides start the next step from the CPU's weights, so an allowed ulp cannot grow (and,
        // through Adam's coupled weight decay, reach the moments).
        params.w[i].upload(want.data(), want.size(), ctx.stream());
      }
    }
  }
}
