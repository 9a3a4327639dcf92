// Tests of lib/cuda's numerics against the CPU reference (built only with CUDA; every case that needs
// a GPU skips visibly without one):
//  - without a GPU: the check macros, argument checks, clear CudaErrors instead of crashes, bench cuda;
//  - quantize bit-exact against lib/numeric on every fp16 and bf16 pattern, their float neighbours and
//    the midpoints between consecutive patterns (ties), random bit patterns, random magnitudes over every
//    binade and SPEC §2's boundary cases, for every format and option, with and without a multiplier;
//  - fp32 ↔ fp16/bf16 storage conversions equal encode()/decode() bit for bit;
//  - tensor_stats: counts, bins and extremes exactly equal to lib/instrument's, sums within SPEC §3's
//    relative 1e-6, one tensor and batched, deterministic;
//  - the fused unscale + found_inf flag;
//  - cuBLAS GEMMs within the fp32 accumulation bound, exact on exact inputs, alpha before rounding.
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

struct FormatCase {
  Format format;
  RoundOptions round;
  std::string name() const {
    return std::string(format_name(format)) + (round.e4m3_overflow_to_nan ? " (overflow to NaN)" : "");
  }
};

// Every format, and fp8_e4m3 with both overflow options.
std::vector<FormatCase> format_cases() {
  std::vector<FormatCase> c;
  for (Format f : all_formats()) c.push_back({f, {}});
  c.push_back({Format::fp8_e4m3, RoundOptions{true}});
  return c;
}

// Every fp16 and bf16 pattern as a float, its float neighbours, and the midpoint to the next pattern
// (a tie for that format, and near one for the others); beyond max finite, max + half an ulp.
std::vector<float> pattern_inputs() {
  std::vector<float> v;
  for (Format f : {Format::fp16, Format::bf16}) {
    const FormatInfo& fi = format_info(f);
    const std::uint32_t max_pattern = encode(static_cast<float>(fi.max_finite), f);
    for (std::uint32_t p = 0; p < 65536; ++p) {
      const float x = decode(p, f);
      v.push_back(x);
      if (!std::isfinite(x)) continue;
      v.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
      v.push_back(std::nextafter(x, -std::numeric_limits<float>::infinity()));
      const std::uint32_t mag = p & 0x7FFFu;
      if (mag < max_pattern) {
        v.push_back(static_cast<float>((static_cast<double>(x) + static_cast<double>(decode(p + 1, f))) / 2));
      } else if (mag == max_pattern) {
        const double prev = decode(p - 1, f);
        v.push_back(static_cast<float>(x + (x - prev) / 2));
      }
    }
  }
  return v;
}

// SPEC §2's boundary cases and specials.
std::vector<float> boundary_inputs() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          65504.0f,
                          65519.996f,
                          65520.0f,
                          -65520.0f,
                          0x1p-25f,
                          0x1p-24f,
                          0x1.8p-25f,
                          0x1.8p-24f,
                          0x1p-26f,
                          0x1p-14f,
                          0x1.ffcp-15f,
                          448.0f,
                          464.0f,
                          480.0f,
                          -464.0f,
                          57344.0f,
                          61440.0f,
                          65536.0f,
                          0x1p-16f,
                          0x1p-17f,
                          0x1.8p-17f,
                          0x1p-9f,
                          0x1p-10f,
                          0x1.8p-10f,
                          0x1p-133f,
                          0x1p-134f,
                          0x1.8p-134f,
                          0x1p-149f,
                          0x1p-126f,
                          3.3895313892515355e38f,
                          3.3961775292304e38f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  v.push_back(std::nextafter(0x1p-25f, 1.0f));
  v.push_back(std::nextafter(464.0f, 1e9f));
  v.push_back(std::nextafter(464.0f, 0.0f));
  v.push_back(std::nextafter(61440.0f, 0.0f));
  v.push_back(std::nextafter(65520.0f, 0.0f));
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFEu,
                            0x7FA5A5A5u, 0xFFC0FFEEu, 0x7F802000u})
    v.push_back(float_of(nan));
  return v;
}

// Random bit patterns (every class, NaNs included) and random magnitudes over every binade.
std::vector<float> random_inputs(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(float_of(static_cast<std::uint32_t>(rng())));
  for (std::size_t i = 0; i < n; ++i) {
    const double e = -152.0 + 282.0 * uniform01(rng);
    const double x = std::exp2(e) * (rng() & 1 ? 1.0 : -1.0);
    v.push_back(static_cast<float>(x));
  }
  return v;
}

std::vector<float> cpu_quantize(const std::vector<float>& in, Format f, RoundOptions opt, float multiplier) {
  std::vector<float> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    out[i] = quantize(multiplier == 1.0f ? in[i] : in[i] * multiplier, f, opt);
  return out;
}

std::vector<float> gpu_quantize(cuda::CudaContext& ctx, const std::vector<float>& in, Format f,
                                RoundOptions opt, float multiplier) {
  auto d_in = test::to_device(in, ctx);
  auto d_out = test::sentinel_buffer<float>(in.size(), ctx);
  cuda::quantize(d_in.data(), d_out.data(), in.size(), f, opt, multiplier, ctx.stream());
  return test::to_host(d_out, ctx);
}

// NaN-insensitive comparison (a multiplied NaN loses its sign on the GPU, quantize.h).
std::size_t value_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      bad += !std::isnan(got[i]);
    } else {
      bad += bits_of(got[i]) != bits_of(want[i]);
    }
  }
  return bad;
}

// ---- statistics ----------------------------------------------------------------------------------

// |gpu − cpu| for a double sum of n float terms: SPEC §3's relative 1e-6, or (for sums that cancel)
// twice the error bound of double summation, n·2^-53·Σ|terms|, whichever is larger.
bool sums_agree(double gpu, double cpu, double abs_terms, std::size_t n) {
  const double tol = std::max(1e-6 * std::fabs(cpu), 2.0 * static_cast<double>(n) * 0x1p-53 * abs_terms);
  return std::fabs(gpu - cpu) <= tol;
}

void check_stats_equal(const TensorStats& gpu, const TensorStats& cpu, const std::vector<float>& v,
                       const std::string& what) {
  INFO(what);
  CHECK(gpu.elements == cpu.elements);
  CHECK(gpu.zero == cpu.zero);
  CHECK(gpu.underflow == cpu.underflow);
  CHECK(gpu.subnormal == cpu.subnormal);
  CHECK(gpu.normal == cpu.normal);
  CHECK(gpu.overflow == cpu.overflow);
  CHECK(gpu.nonfinite == cpu.nonfinite);
  CHECK(gpu.count == cpu.count);
  std::size_t bin_mismatch = 0;
  for (std::size_t b = 0; b < gpu.binades.size(); ++b) bin_mismatch += gpu.binades[b] != cpu.binades[b];
  CHECK(bin_mismatch == 0);
  CHECK(gpu.min == cpu.min);
  CHECK(gpu.max == cpu.max);
  CHECK(gpu.max_abs == cpu.max_abs);
  CHECK(gpu.min_nonzero_abs == cpu.min_nonzero_abs);
  double abs_sum = 0, sq_sum = 0;
  for (float x : v)
    if (std::isfinite(x)) abs_sum += std::fabs(static_cast<double>(x)), sq_sum += static_cast<double>(x) * x;
  CAPTURE(gpu.sum, cpu.sum, gpu.sum_squares, cpu.sum_squares);
  CHECK(sums_agree(gpu.sum, cpu.sum, abs_sum, v.size()));
  CHECK(sums_agree(gpu.sum_squares, cpu.sum_squares, sq_sum, v.size()));
}

// Tensors for the statistics: empty, single values, all zeros, all NaN, a large mixed tensor (every
// binade, float subnormals, zeros, NaN/inf with payloads and signs), values packed around each format's
// underflow and overflow thresholds, and sizes that are no multiple of any block size.
std::vector<std::vector<float>> stats_tensors() {
  std::vector<std::vector<float>> t;
  t.push_back({});
  t.push_back({0.0f});
  t.push_back({-0x1p-149f});
  t.push_back(std::vector<float>(1000, 0.0f));
  t.push_back(std::vector<float>(300, float_of(0xFFC00001u)));
  Rng rng(123);
  auto mixed = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) {
      const double u = uniform01(rng);
      if (u < 0.05) {
        x = rng() & 1 ? 0.0f : -0.0f;
      } else if (u < 0.051) {
        x = float_of(0x7F800001u | static_cast<std::uint32_t>(rng() & 0x807FFFFFu));  // NaN, any sign/payload
      } else if (u < 0.052) {
        x = rng() & 1 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
      } else if (u < 0.06) {
        x = float_of(static_cast<std::uint32_t>(rng() & 0x807FFFFFu));  // float subnormal (or ±0)
      } else {
        x = static_cast<float>(std::exp2(-150.0 + 279.0 * uniform01(rng)) * (rng() & 1 ? 1.0 : -1.0));
      }
    }
    return v;
  };
  t.push_back(mixed(257));
  t.push_back(mixed(test::gpu_or_cpu_target<std::size_t>(1000003, 100003)));
  // More than one grid-stride pass per thread (the GPU's size also reaches the grids' caps of blocks).
  t.push_back(mixed(test::gpu_or_cpu_target<std::size_t>((std::size_t{1} << 22) + 17, (std::size_t{1} << 18) + 17)));
  // Around every format's thresholds: log-uniform over [min_subnormal/8, 4·min_normal] and
  // [max_finite/4, 4·max_finite].
  std::vector<float> edges;
  for (Format f : all_formats()) {
    const FormatInfo& fi = format_info(f);
    for (int i = 0; i < 20000; ++i) {
      const bool low = rng() & 1;
      const double lo = low ? fi.min_subnormal / 8 : fi.max_finite / 4;
      const double hi = low ? fi.min_normal * 4 : std::min(fi.max_finite * 4, 3.4e38);
      const double x = std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * uniform01(rng));
      edges.push_back(static_cast<float>(x) * (rng() & 1 ? 1.0f : -1.0f));
    }
  }
  t.push_back(edges);
  return t;
}

// ---- GEMM ----------------------------------------------------------------------------------------

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

// ==== without a GPU ===============================================================================

TEST_CASE("GS_CUDA_CHECK and GS_CUBLAS_CHECK throw CudaError naming the call, the status and file:line",
          "[cuda]") {
  auto cuda_fails = [] { return cudaErrorInvalidValue; };
  try {
    GS_CUDA_CHECK(cuda_fails());
    FAIL("no exception");
  } catch (const CudaError& e) {
    CHECK_THAT(e.what(), Contains("`cuda_fails()` failed") && Contains("cudaErrorInvalidValue") &&
                             Contains("test_cuda.cpp:"));
  }
  auto cublas_fails = [] { return CUBLAS_STATUS_INVALID_VALUE; };
  try {
    GS_CUBLAS_CHECK(cublas_fails());
    FAIL("no exception");
  } catch (const CudaError& e) {
    CHECK_THAT(e.what(), Contains("`cublas_fails()` failed") && Contains("CUBLAS_STATUS_INVALID_VALUE") &&
                             Contains("test_cuda.cpp:"));
  }
  CHECK_NOTHROW([] { GS_CUDA_CHECK(cudaSuccess); }());
  CHECK_NOTHROW([] { GS_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS); }());
}

TEST_CASE("CUDA entries check their arguments before touching the device", "[cuda]") {
  // These run with or without a GPU: the checks come before any CUDA call.
  CHECK_THROWS_WITH(cuda::quantize(nullptr, nullptr, 10, Format::fp16, {}, 1.0f, nullptr),
                    Contains("null pointer"));
  CHECK_NOTHROW(
      cuda::quantize(nullptr, nullptr, 0, Format::fp16, {}, 1.0f, nullptr));  // empty: nothing to do
  CHECK_THROWS_AS(
      cuda::max_pool_forward(nullptr, cuda::PoolGeometry{1, 3, 3, 0, 1}, nullptr, nullptr, nullptr),
      ShapeError);
  CHECK_THROWS_AS(cuda::im2col(nullptr, cuda::ConvGeometry{1, 1, 2, 2, 5, 1, 0}, nullptr, nullptr),
                  ShapeError);
  CHECK_THROWS_WITH(cuda::im2col_16bit(nullptr, cuda::ConvGeometry{1, 1, 2, 2, 1, 1, 0}, nullptr,
                                       cuda::DeviceType::f32, nullptr),
                    Contains("fp32 is not a 16-bit type"));
  const cuda::UnscaleJob zero_scale{nullptr, nullptr, 0, 0.0};
  int flag = 0;
  CHECK_THROWS_AS(cuda::unscale_accumulate(&zero_scale, 1, &flag, nullptr), NumericError);
  cuda::DeviceOptimizerStep* no_step = nullptr;
  CHECK_THROWS_AS(cuda::sgd_update(nullptr, nullptr, nullptr, 0, cuda::SgdParams{0.1, 1.5}, no_step, nullptr),
                  ConfigError);
  CHECK_THROWS_WITH(cuda::relu_forward(nullptr, nullptr, 4, nullptr), Contains("null pointer"));
  cuda::DeviceEdgeCounts counts{};
  CHECK_THROWS_WITH(cuda::count_about_edge(nullptr, 4, 1u, &counts, nullptr), Contains("null data"));
  CHECK_NOTHROW(cuda::count_about_edge(nullptr, 0, 1u, &counts, nullptr));
  const cuda::NonFiniteJob null_job{nullptr, 3};
  unsigned long long first = 0;
  CHECK_THROWS_WITH(cuda::first_nonfinite(&null_job, 1, &first, nullptr), Contains("tensor 0 of 3 elements is null"));
  CHECK_NOTHROW(cuda::first_nonfinite(nullptr, 0, nullptr, nullptr));
}

TEST_CASE("Without a CUDA device the backend throws clear CudaErrors and never crashes", "[cuda]") {
  if (cuda::device_count() > 0)
    test::skip_test("a CUDA device is present: the no-device path cannot run here");
  CHECK(!cuda::no_device_reason().empty());
  CHECK_THROWS_AS(cuda::CudaContext(), CudaError);
  CHECK_THROWS_WITH(cuda::CudaContext(), Contains("no CUDA device"));
  CHECK_THROWS_WITH(cuda::DeviceBuffer<float>(16), Contains("cudaMalloc"));
  // A kernel launch without a device is reported by the launch check, not by a crash.
  float* fake = reinterpret_cast<float*>(std::uintptr_t{4096});
  CHECK_THROWS_AS(cuda::relu_forward(fake, fake, 16, nullptr), CudaError);
  CHECK_THROWS_AS(cuda::quantize(fake, fake, 16, Format::fp16, {}, 1.0f, nullptr), CudaError);
}

TEST_CASE("bench cuda prints one row per kernel, or one line and exit 0 without a GPU", "[cuda][cli]") {
  test::require_gpu_hardware("bench cuda is the CLI's, built on the real CUDA runtime, and measures speed");
  const test::CliResult r = test::run_cli("bench cuda --elements 100003 --repeats 2");
  REQUIRE(r.status == 0);
  REQUIRE(!r.lines.empty());
  if (cuda::device_count() == 0) {
    REQUIRE(r.lines.size() == 1);
    CHECK_THAT(r.lines[0], Contains("gradscale bench cuda: no CUDA device"));
    return;
  }
  CHECK_THAT(r.lines[0], Contains("gradscale bench cuda: ") && Contains("100003 floats"));
  std::string all;
  for (const std::string& l : r.lines) all += l + "\n";
  for (const char* row : {"device-to-device copy", "tensor_stats fp16", "max_abs_bits", "quantize fp16",
                          "quantize fp8_e4m3", "to_fp16", "to_bf16", "unscale_accumulate", "im2col", "col2im"})
    CHECK_THAT(all, Contains(row));
}

// ==== quantize and storage conversions ===========================================================

TEST_CASE("cuda::quantize equals lib/numeric bit for bit on every fp16 and bf16 pattern, neighbours and ties",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<float> in = pattern_inputs();
  REQUIRE(in.size() > 400000);
  for (const FormatCase& fc : format_cases()) {
    INFO(fc.name());
    const std::vector<float> got = gpu_quantize(ctx, in, fc.format, fc.round, 1.0f);
    const std::string report = bit_mismatches(got, cpu_quantize(in, fc.format, fc.round, 1.0f), &in);
    CHECK(report.empty());
    if (!report.empty()) WARN(report);
  }
}

TEST_CASE("cuda::quantize equals lib/numeric bit for bit on random floats and the SPEC boundary cases",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::vector<float> in = random_inputs(1 << 20, 7);
  const std::vector<float> edges = boundary_inputs();
  for (float x : edges) {
    in.push_back(x);
    in.push_back(-x);
  }
  for (const FormatCase& fc : format_cases()) {
    INFO(fc.name());
    const std::string report = bit_mismatches(gpu_quantize(ctx, in, fc.format, fc.round, 1.0f),
                                              cpu_quantize(in, fc.format, fc.round, 1.0f), &in);
    CHECK(report.empty());
    if (!report.empty()) WARN(report);
    // A local scale or S0 multiplied in first (one fp32 multiplication, as round_gradient does).
    for (float multiplier : {2.0f, 0.5f, 1024.0f, 0x1p-20f, 3.0f, 0.1f}) {
      CAPTURE(multiplier);
      CHECK(value_mismatches(gpu_quantize(ctx, in, fc.format, fc.round, multiplier),
                             cpu_quantize(in, fc.format, fc.round, multiplier)) == 0);
    }
  }
  // The SPEC §2 cases by value, independently of lib/numeric.
  const std::vector<float> spec = {65519.996f, 65520.0f, 0x1p-25f, std::nextafter(0x1p-25f, 1.0f)};
  const std::vector<float> out = gpu_quantize(ctx, spec, Format::fp16, {}, 1.0f);
  CHECK(out[0] == 65504.0f);
  CHECK(std::isinf(out[1]));
  CHECK(bits_of(out[2]) == 0u);
  CHECK(out[3] == 0x1p-24f);
}

TEST_CASE("fp32 <-> fp16 / bf16 storage conversions equal encode() and decode() bit for bit", "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::vector<float> in = pattern_inputs();
  const std::vector<float> more = random_inputs(1 << 18, 11);
  in.insert(in.end(), more.begin(), more.end());
  const std::vector<float> edges = boundary_inputs();
  in.insert(in.end(), edges.begin(), edges.end());
  const std::size_t n = in.size();
  auto d_in = test::to_device(in, ctx);
  std::vector<std::uint16_t> all_patterns(65536);
  for (std::uint32_t p = 0; p < 65536; ++p) all_patterns[p] = static_cast<std::uint16_t>(p);

  for (Format f : {Format::fp16, Format::bf16}) {
    INFO(format_name(f));
    auto stored = test::sentinel_buffer<std::uint16_t>(n, ctx);
    if (f == Format::fp16)
      cuda::to_fp16(d_in.data(), reinterpret_cast<__half*>(stored.data()), n, ctx.stream());
    else
      cuda::to_bf16(d_in.data(), reinterpret_cast<__nv_bfloat16*>(stored.data()), n, ctx.stream());
    const std::vector<std::uint16_t> got = test::to_host(stored, ctx);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += got[i] != encode(in[i], f);
    CHECK(bad == 0);

    // Every pattern back to fp32: decode().
    auto d_patterns = test::to_device(all_patterns, ctx);
    auto values = test::sentinel_buffer<float>(65536, ctx);
    if (f == Format::fp16)
      cuda::from_fp16(reinterpret_cast<const __half*>(d_patterns.data()), values.data(), 65536, ctx.stream());
    else
      cuda::from_bf16(reinterpret_cast<const __nv_bfloat16*>(d_patterns.data()), values.data(), 65536,
                      ctx.stream());
    std::vector<float> want(65536);
    for (std::uint32_t p = 0; p < 65536; ++p) want[p] = decode(p, f);
    const std::string report = bit_mismatches(test::to_host(values, ctx), want);
    CHECK(report.empty());
    if (!report.empty()) WARN(report);
  }
}

// ==== statistics ==================================================================================

TEST_CASE("cuda::tensor_stats equals lib/instrument: counts and bins exactly, sums within 1e-6", "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<std::vector<float>> tensors = stats_tensors();
  std::vector<cuda::DeviceBuffer<float>> device;
  for (const auto& t : tensors) device.push_back(test::to_device(t, ctx));

  SECTION("one tensor per call") {
    auto out = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      for (const FormatCase& fc : format_cases()) {
        cuda::tensor_stats(ctx, device[i].data(), tensors[i].size(), fc.format, fc.round, out.data());
        const TensorStats gpu = cuda::download_stats(ctx, out.data(), 1)[0];
        const TensorStats cpu = tensor_stats(tensors[i].data(), tensors[i].size(), fc.format, fc.round);
        check_stats_equal(gpu, cpu, tensors[i], "tensor " + std::to_string(i) + ", " + fc.name());
      }
    }
  }

  SECTION("every tensor and format in one batched call (several launches of 32), deterministic") {
    std::vector<cuda::StatsJob> jobs;
    std::vector<std::pair<std::size_t, FormatCase>> which;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      for (const FormatCase& fc : format_cases()) {
        jobs.push_back({device[i].data(), tensors[i].size(), fc.format, fc.round});
        which.emplace_back(i, fc);
      }
    REQUIRE(jobs.size() > 32);
    auto out = test::sentinel_buffer<cuda::DeviceStats>(jobs.size(), ctx);
    cuda::tensor_stats(ctx, jobs, out.data());
    const std::vector<cuda::DeviceStats> first = test::to_host(out, ctx);
    const std::vector<TensorStats> gpu = cuda::download_stats(ctx, out.data(), jobs.size());
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      const auto& [i, fc] = which[j];
      const TensorStats cpu = tensor_stats(tensors[i].data(), tensors[i].size(), fc.format, fc.round);
      check_stats_equal(gpu[j], cpu, tensors[i],
                        "job " + std::to_string(j) + ": tensor " + std::to_string(i) + ", " + fc.name());
    }
    out.fill_bytes(0xFF, ctx.stream());
    cuda::tensor_stats(ctx, jobs, out.data());
    const std::vector<cuda::DeviceStats> second = test::to_host(out, ctx);
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(cuda::DeviceStats)) == 0);
  }
}

TEST_CASE("cuda::max_abs_bits gives lib/instrument's max_abs bit for bit, inf for a value not finite", "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::vector<std::vector<float>> tensors = stats_tensors();
  for (std::size_t i = 0, n = tensors.size(); i < n; ++i) {  // each again without its infs and NaNs
    std::vector<float> finite = tensors[i];
    for (float& x : finite)
      if (!std::isfinite(x)) x = -0x1p-140f;
    tensors.push_back(finite);
  }
  tensors.push_back({-3.0f, std::numeric_limits<float>::infinity(), 2.0f});  // inf alone
  auto out = test::sentinel_buffer<unsigned>(1, ctx);
  int finite_cases = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto d = test::to_device(tensors[i], ctx);
    cuda::max_abs_bits(d.data(), tensors[i].size(), out.data(), ctx.stream());
    const float gpu = cuda::max_abs_of_bits(test::to_host(out, ctx)[0]);
    const float cpu = max_abs(tensors[i].data(), tensors[i].size());
    INFO("tensor " << i << " of " << tensors[i].size() << " values: gpu " << gpu << ", cpu " << cpu);
    CHECK(test::bits_of(gpu) == test::bits_of(std::isnan(cpu) ? std::numeric_limits<float>::infinity() : cpu));
    finite_cases += std::isfinite(cpu) && cpu > 0;
  }
  CHECK(finite_cases >= 4);  // the finite maxima are compared too, not only inf
}

TEST_CASE("cuda::count_about_edge adds the CPU's counts about an edge, for every format and option", "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<std::vector<float>> tensors = stats_tensors();
  auto out = test::sentinel_buffer<cuda::DeviceEdgeCounts>(1, ctx);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const cuda::DeviceBuffer<float> d = test::to_device(tensors[i], ctx);
    for (const FormatCase& fc : format_cases()) {
      // popart_als's edge (bin_edge · max_finite(F)), a small one and one at a format's threshold.
      const double top = std::isfinite(format_info(fc.format).max_finite) ? format_info(fc.format).max_finite : 1e30;
      for (const double edge : {top / 16, 1e-6, 0x1p-24, 1.0}) {
        INFO("tensor " << i << ", " << fc.name() << ", edge " << edge);
        const auto e = static_cast<float>(edge);
        out.fill_bytes(0, ctx.stream());
        // Twice into the same record: the counts add up.
        const std::uint32_t t = edge_threshold_bits(e, fc.format, fc.round);
        cuda::count_about_edge(d.data(), tensors[i].size(), t, out.data(), ctx.stream());
        cuda::count_about_edge(d.data(), tensors[i].size(), t, out.data(), ctx.stream());
        const cuda::DeviceEdgeCounts got = test::to_host(out, ctx)[0];
        const EdgeCounts want = count_about_edge(tensors[i].data(), tensors[i].size(), e, fc.format, fc.round);
        CHECK(got.below == 2 * want.below);
        CHECK(got.above == 2 * want.above);
      }
    }
  }
}

TEST_CASE("cuda::first_nonfinite finds the first inf or NaN of each tensor in one batched call", "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::vector<std::vector<float>> tensors = stats_tensors();  // with NaN and inf among the values
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Hand-placed cases: all finite, the first and the last element, one far into a large tensor.
  tensors.push_back(std::vector<float>(1000, 1.5f));
  tensors.push_back(std::vector<float>{nan, 1.0f, inf});
  tensors.push_back(std::vector<float>(4097, -2.0f));
  tensors.back().back() = -inf;
  tensors.push_back(std::vector<float>((1u << 22) + 17, 0.25f));
  tensors.back()[(1u << 22) + 3] = nan;
  tensors.back()[(1u << 22) + 9] = inf;
  tensors.push_back({});
  // More than one launch of 32 tensors: the list again, shifted by one.
  const std::size_t base = tensors.size();
  for (std::size_t i = 0; i < base; ++i) tensors.push_back(tensors[(i + 1) % base]);
  while (tensors.size() <= 40) tensors.push_back(std::vector<float>(33, 3.0f));
  std::vector<cuda::DeviceBuffer<float>> device;
  std::vector<cuda::NonFiniteJob> jobs;
  for (const auto& t : tensors) {
    device.push_back(test::to_device(t, ctx));
    jobs.push_back({device.back().data(), t.size()});
  }
  auto first = test::sentinel_buffer<unsigned long long>(jobs.size(), ctx);
  cuda::first_nonfinite(jobs.data(), jobs.size(), first.data(), ctx.stream());
  const std::vector<unsigned long long> got = test::to_host(first, ctx);
  std::size_t with_nonfinite = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << i << " of " << tensors[i].size() << " values");
    const std::int64_t want = first_nonfinite(tensors[i].data(), tensors[i].size());
    with_nonfinite += want >= 0;
    CHECK(got[i] == (want < 0 ? cuda::kAllFinite : static_cast<unsigned long long>(want)));
  }
  CHECK(with_nonfinite >= 6);  // the test has cases of both kinds
}

// ==== unscale and found_inf =======================================================================

TEST_CASE("cuda::unscale_accumulate adds g/S to the master gradient bit for bit and flags non-finite values",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(5);
  const std::vector<double> scales = {1.0, 1024.0, 65536.0, 3.0, 0.5, 0x1p-10};
  const std::size_t jobs_n = 40;  // more than one launch of 32
  std::vector<std::vector<float>> grads(jobs_n), masters(jobs_n);
  for (std::size_t j = 0; j < jobs_n; ++j) {
    const std::size_t n = j == 0 ? 0 : j == 1 ? 1 : j == 7 ? 100003 : 1 + (rng() % 5000);
    for (std::size_t i = 0; i < n; ++i) {
      grads[j].push_back(quantize(static_cast<float>(standard_normal(rng) * 100), Format::fp16));
      masters[j].push_back(static_cast<float>(standard_normal(rng)));
    }
  }
  std::vector<cuda::DeviceBuffer<float>> d_grad, d_master;
  std::vector<cuda::UnscaleJob> jobs;
  for (std::size_t j = 0; j < jobs_n; ++j) {
    d_grad.push_back(test::to_device(grads[j], ctx));
    d_master.push_back(test::to_device(masters[j], ctx));
    jobs.push_back({d_grad[j].data(), d_master[j].data(), grads[j].size(), scales[j % scales.size()]});
  }
  cuda::DeviceBuffer<int> flag(1);
  flag.fill_bytes(0, ctx.stream());
  cuda::unscale_accumulate(jobs, flag.data(), ctx.stream());
  for (std::size_t j = 0; j < jobs_n; ++j) {
    INFO("tensor " << j);
    std::vector<float> want = masters[j];
    const auto s = static_cast<float>(jobs[j].scale);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = want[i] + grads[j][i] / s;
    CHECK(bit_mismatches(test::to_host(d_master[j], ctx), want).empty());
  }
  CHECK(test::to_host(flag, ctx)[0] == 0);

  // A non-finite value in any tensor sets the flag: inf in an unscaled gradient, NaN in a check-only
  // one, g/S overflowing; a clean run afterwards leaves it set. Each run starts from the original
  // master gradients (an overflow leaves an inf in one).
  auto run_with = [&](std::size_t job, float value, bool check_only, double scale) {
    for (std::size_t j = 0; j < jobs_n; ++j)
      d_master[j].upload(masters[j].data(), masters[j].size(), ctx.stream());
    std::vector<float> g = grads[job];
    g[g.size() / 2] = value;
    auto d = test::to_device(g, ctx);
    std::vector<cuda::UnscaleJob> js = jobs;
    js[job].grad = d.data();
    js[job].scale = scale;
    if (check_only) js[job].master = nullptr;
    flag.fill_bytes(0, ctx.stream());
    cuda::unscale_accumulate(js, flag.data(), ctx.stream());
    return test::to_host(flag, ctx)[0];
  };
  CHECK(run_with(37, std::numeric_limits<float>::infinity(), false, 1024.0) == 1);
  CHECK(run_with(7, std::numeric_limits<float>::quiet_NaN(), true, 1.0) == 1);
  CHECK(run_with(2, 60000.0f, false, 0x1p-120) == 1);  // finite g, g/S = inf
  CHECK(run_with(3, 1.0f, false, 1.0) == 0);
  // The flag is only ever set: a clean run after a non-finite one leaves it at 1.
  for (std::size_t j = 0; j < jobs_n; ++j)
    d_master[j].upload(masters[j].data(), masters[j].size(), ctx.stream());
  flag.fill_bytes(0, ctx.stream());
  std::vector<cuda::UnscaleJob> bad = jobs;
  std::vector<float> nan_grad(5, std::numeric_limits<float>::quiet_NaN());
  auto d_nan = test::to_device(nan_grad, ctx);
  bad.push_back({d_nan.data(), nullptr, nan_grad.size(), 1.0});
  cuda::unscale_accumulate(bad, flag.data(), ctx.stream());
  cuda::unscale_accumulate(jobs, flag.data(), ctx.stream());
  CHECK(test::to_host(flag, ctx)[0] == 1);
}

// ==== GEMM ========================================================================================

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
