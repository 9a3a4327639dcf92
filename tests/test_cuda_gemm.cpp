// Tests of lib/cuda's cuBLAS GEMMs against fp64 (built only with CUDA; a case that needs a GPU skips
// visibly without one): fp16/bf16 inputs within the fp32 accumulation bound, exact on exact inputs,
// alpha applied to the fp32 accumulator before rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/core/random.h"
#include "lib/cuda/check.h"
#include "lib/cuda/context.h"
#include "lib/cuda/convert.h"
#include "lib/cuda/device_buffer.h"
#include "lib/cuda/edge_counts.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/maxpool.h"
#include "lib/cuda/nonfinite.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/relu.h"
#include "lib/cuda/sgd.h"
#include "lib/cuda/stats.h"
#include "lib/cuda/unscale.h"
#include "lib/instrument/finite_scan.h"
#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"
#include "tests/cli_run.h"
#include "tests/cuda_test.h"

using namespace gradscale;
using Catch::Matchers::Contains;
using test::bit_mismatches;
using test::bits_of;
using test::float_of;

namespace {

constexpr double kU32 = 0x1p-24;  // unit roundoff of fp32

// Row-major element (r, c) of op(M) where M is stored [rows, cols] (transposed: op(M) = Mᵀ).
double op_at(const std::vector<float>& m, bool transposed, std::int64_t stored_cols, std::int64_t r,
             std::int64_t c) {
  return transposed ? m[static_cast<std::size_t>(c * stored_cols + r)]
                    : m[static_cast<std::size_t>(r * stored_cols + c)];
}

std::vector<std::uint16_t> encode_all(const std::vector<float>& v, Format f) {
  std::vector<std::uint16_t> e(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) e[i] = static_cast<std::uint16_t>(encode(v[i], f));
  return e;
}

// Uploads float values (already in F) as F storage: __half / __nv_bfloat16 bits from encode().
cuda::DeviceBuffer<std::uint16_t> upload_storage(const std::vector<float>& v, Format f,
                                                 cuda::CudaContext& ctx) {
  return test::to_device(encode_all(v, f), ctx);
}

std::vector<float> download_output(const void* data, std::size_t n, cuda::DeviceType t,
                                   cuda::CudaContext& ctx) {
  std::vector<float> out(n);
  if (t == cuda::DeviceType::f32) {
    GS_CUDA_CHECK(cudaMemcpy(out.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<std::uint16_t> bits(n);
  GS_CUDA_CHECK(cudaMemcpy(bits.data(), data, n * sizeof(std::uint16_t), cudaMemcpyDeviceToHost));
  const Format f = t == cuda::DeviceType::f16 ? Format::fp16 : Format::bf16;
  for (std::size_t i = 0; i < n; ++i) out[i] = decode(bits[i], f);
  (void)ctx;
  return out;
}

struct GemmCase {
  std::int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  std::int64_t batch;
};

}  // namespace

TEST_CASE("cuda::gemm with fp16/bf16 inputs stays within the fp32 accumulation bound", "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  // Bound per element (gemm.h): the products of F values are exact in fp32; each of the K − 1 fp32 sums
  // errs by at most u32 relative (2·u32 for the truncating accumulation tensor cores may use), alpha and
  // beta·C add one rounding each: |c − exact| ≤ 2·(K + 2)·u32·(|alpha|·Σ|a||b| + |beta·C0|). An F output
  // adds its own rounding of the fp32 result: u_F·|c| + half F's smallest subnormal.
  const std::vector<GemmCase> cases = {
      {1, 1, 1, false, false, 1.0f, 0.0f, 1},      {7, 5, 3, false, false, 1.0f, 0.0f, 1},
      {33, 65, 129, false, false, 8.0f, 0.0f, 1},  {33, 65, 129, true, false, 1.0f, 1.0f, 1},
      {33, 65, 129, false, true, 0.75f, 0.0f, 1},  {33, 65, 129, true, true, 1.0f, 0.5f, 1},
      {17, 31, 4097, false, false, 1.0f, 0.0f, 1}, {128, 96, 1000, false, true, 0x1p-4f, 0.0f, 1},
      {9, 13, 21, true, false, 2.0f, 1.0f, 3}};
  Rng rng(17);
  for (Format f : {Format::fp16, Format::bf16}) {
    const cuda::DeviceType storage = f == Format::fp16 ? cuda::DeviceType::f16 : cuda::DeviceType::bf16;
    const double u_f = std::ldexp(1.0, -(format_info(f).mantissa_bits + 1));
    for (const GemmCase& gc : cases) {
      for (cuda::DeviceType out_type : {cuda::DeviceType::f32, storage}) {
        INFO(format_name(f) << " -> " << cuda::device_type_name(out_type) << ": m " << gc.m << " n " << gc.n
                            << " k " << gc.k << " ta " << gc.ta << " tb " << gc.tb << " alpha " << gc.alpha
                            << " beta " << gc.beta << " batch " << gc.batch);
        const std::int64_t a_size = gc.m * gc.k, b_size = gc.k * gc.n, c_size = gc.m * gc.n;
        std::vector<float> a(static_cast<std::size_t>(a_size * gc.batch)),
            b(static_cast<std::size_t>(b_size * gc.batch));
        std::vector<float> c0(static_cast<std::size_t>(c_size * gc.batch));
        for (float& x : a) x = quantize(static_cast<float>(standard_normal(rng)), f);
        for (float& x : b) x = quantize(static_cast<float>(standard_normal(rng) * 0.1), f);
        for (float& x : c0)
          x = quantize(static_cast<float>(standard_normal(rng)),
                       out_type == cuda::DeviceType::f32 ? Format::fp32 : f);
        auto d_a = upload_storage(a, f, ctx);
        auto d_b = upload_storage(b, f, ctx);
        cuda::DeviceBuffer<float> c32;
        cuda::DeviceBuffer<std::uint16_t> c16;
        void* c_ptr = nullptr;
        if (out_type == cuda::DeviceType::f32) {
          c32 = test::to_device(c0, ctx);
          c_ptr = c32.data();
        } else {
          c16 = upload_storage(c0, f, ctx);
          c_ptr = c16.data();
        }
        cuda::gemm(ctx, gc.m, gc.n, gc.k, gc.alpha, {d_a.data(), storage, gc.ta, a_size},
                   {d_b.data(), storage, gc.tb, b_size}, gc.beta, {c_ptr, out_type, c_size}, gc.batch);
        ctx.synchronize();
        const std::vector<float> c = download_output(c_ptr, c0.size(), out_type, ctx);
        std::size_t bad = 0;
        double worst = 0;
        for (std::int64_t bt = 0; bt < gc.batch; ++bt) {
          const std::vector<float> ab(a.begin() + bt * a_size, a.begin() + (bt + 1) * a_size);
          const std::vector<float> bb(b.begin() + bt * b_size, b.begin() + (bt + 1) * b_size);
          for (std::int64_t i = 0; i < gc.m; ++i)
            for (std::int64_t j = 0; j < gc.n; ++j) {
              double exact = 0, abs = 0;
              for (std::int64_t p = 0; p < gc.k; ++p) {
                const double prod =
                    op_at(ab, gc.ta, gc.ta ? gc.m : gc.k, i, p) * op_at(bb, gc.tb, gc.tb ? gc.k : gc.n, p, j);
                exact += prod;  // products of F values are exact in double; the sum errs ~2^-53 relative
                abs += std::fabs(prod);
              }
              const std::size_t at = static_cast<std::size_t>(bt * c_size + i * gc.n + j);
              const double ref = gc.alpha * exact + gc.beta * static_cast<double>(c0[at]);
              double tol = 2.0 * static_cast<double>(gc.k + 2) * kU32 *
                           (std::fabs(gc.alpha) * abs + std::fabs(gc.beta * static_cast<double>(c0[at])));
              if (out_type != cuda::DeviceType::f32)
                tol += u_f * (std::fabs(ref) + tol) + format_info(f).min_subnormal / 2;
              const double err = std::fabs(static_cast<double>(c[at]) - ref);
              bad += !(err <= tol);
              worst = std::max(worst, tol > 0 ? err / tol : err);
            }
        }
        CAPTURE(worst);
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("cuda::gemm is exact on exact inputs and applies alpha to the fp32 accumulator before rounding",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(3);
  // Small integers: every product and partial sum is an integer below 2^24, exact in fp32.
  const std::int64_t m = 37, n = 45, k = 1000;
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  for (float& x : a) x = static_cast<float>(static_cast<int>(uniform_below(rng, 17)) - 8);
  for (float& x : b) x = static_cast<float>(static_cast<int>(uniform_below(rng, 17)) - 8);
  std::vector<float> exact(static_cast<std::size_t>(m * n), 0.0f);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p)
        s += static_cast<double>(a[static_cast<std::size_t>(i * k + p)]) *
             b[static_cast<std::size_t>(p * n + j)];
      exact[static_cast<std::size_t>(i * n + j)] = static_cast<float>(2.0 * s);
    }
  REQUIRE(std::any_of(exact.begin(), exact.end(), [](float x) { return x != 0.0f; }));
  for (Format f : {Format::fp16, Format::bf16}) {
    INFO(format_name(f));
    const cuda::DeviceType storage = f == Format::fp16 ? cuda::DeviceType::f16 : cuda::DeviceType::bf16;
    auto d_a = upload_storage(a, f, ctx);
    auto d_b = upload_storage(b, f, ctx);
    auto c = test::sentinel_buffer<float>(exact.size(), ctx);
    cuda::gemm(ctx, m, n, k, 2.0f, {d_a.data(), storage}, {d_b.data(), storage}, 0.0f,
               {c.data(), cuda::DeviceType::f32});
    CHECK(bit_mismatches(test::to_host(c, ctx), exact).empty());
  }
  // fp32 storage of F values (the emulation's arrays): the same exact result.
  auto d_a32 = test::to_device(a, ctx);
  auto d_b32 = test::to_device(b, ctx);
  auto c32 = test::sentinel_buffer<float>(exact.size(), ctx);
  cuda::gemm(ctx, m, n, k, 2.0f, {d_a32.data()}, {d_b32.data()}, 0.0f, {c32.data()});
  CHECK(bit_mismatches(test::to_host(c32, ctx), exact).empty());

  // SPEC §5: s multiplies the fp32 accumulator before the one rounding to F. 255·255·2 = 130050
  // overflows fp16, but with alpha = 1/4 the result 32512.5 rounds to a finite fp16 value.
  const std::vector<float> big = {255.0f, 255.0f};
  auto d_big = upload_storage(big, Format::fp16, ctx);
  auto out = test::sentinel_buffer<std::uint16_t>(1, ctx);
  cuda::gemm(ctx, 1, 1, 2, 1.0f, {d_big.data(), cuda::DeviceType::f16}, {d_big.data(), cuda::DeviceType::f16},
             0.0f, {out.data(), cuda::DeviceType::f16});
  CHECK(std::isinf(decode(test::to_host(out, ctx)[0], Format::fp16)));
  cuda::gemm(ctx, 1, 1, 2, 0.25f, {d_big.data(), cuda::DeviceType::f16},
             {d_big.data(), cuda::DeviceType::f16}, 0.0f, {out.data(), cuda::DeviceType::f16});
  CHECK(decode(test::to_host(out, ctx)[0], Format::fp16) == quantize(32512.5f, Format::fp16));

  // Type combinations outside the supported set are refused before cuBLAS sees them.
  CHECK_THROWS_AS(
      cuda::gemm(ctx, 1, 1, 2, 1.0f, {d_big.data(), cuda::DeviceType::f16},
                 {d_big.data(), cuda::DeviceType::bf16}, 0.0f, {out.data(), cuda::DeviceType::f32}),
      ConfigError);
  CHECK_THROWS_AS(
      cuda::gemm(ctx, -1, 1, 2, 1.0f, {d_big.data(), cuda::DeviceType::f16},
                 {d_big.data(), cuda::DeviceType::f16}, 0.0f, {out.data(), cuda::DeviceType::f32}),
      ShapeError);
}
