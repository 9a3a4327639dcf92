// Tests of lib/cuda's quantize and storage conversions against lib/numeric (built only with CUDA; a case
// that needs a GPU skips visibly without one): bit-exact on every fp16 and bf16 pattern, their float
// neighbours and ties, random floats and SPEC §2's boundary cases; fp32 <-> fp16/bf16 equal encode/decode.
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
#include "lib/cuda/working_copies.h"
#include "lib/instrument/finite_scan.h"
#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"
#include "tests/cli_run.h"
#include "tests/cuda_format_cases.h"
#include "tests/cuda_test.h"

using namespace gradscale;
using Catch::Matchers::Contains;
using test::bit_mismatches;
using test::bits_of;
using test::float_of;
using namespace gradscale::test::cuda_fixtures;

namespace {

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

}  // namespace

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

TEST_CASE("cuda::round_copies rounds many tensors in one launch per 32, with quantize's bits and their 16-bit copies",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  struct Case {
    Format format;
    RoundOptions opt;
  };
  RoundOptions nan_option;
  nan_option.e4m3_overflow_to_nan = true;
  for (const Case& k : {Case{Format::fp16, {}}, Case{Format::bf16, {}}, Case{Format::fp8_e4m3, nan_option},
                        Case{Format::fp32, {}}}) {
    INFO(format_name(k.format));
    // 40 tensors (two launches): one empty, one rounded in place, sizes from 2 to 3000; where F is fp16
    // or bf16, every other one also gets its 16-bit copy.
    const cuda::DeviceType half_type = k.format == Format::fp16   ? cuda::DeviceType::f16
                                       : k.format == Format::bf16 ? cuda::DeviceType::bf16
                                                                  : cuda::DeviceType::f32;
    constexpr int kJobs = 40;
    std::vector<std::vector<float>> inputs;
    std::vector<cuda::DeviceBuffer<float>> src, dst;
    std::vector<cuda::DeviceBuffer<std::uint16_t>> half;
    std::vector<cuda::CopyJob> jobs;
    for (int j = 0; j < kJobs; ++j) {
      // random_inputs gives 2·m values: random patterns, then random magnitudes.
      const std::size_t m = j == 3 ? 0 : j == 7 ? 1500 : static_cast<std::size_t>(1 + (j * 97) % 350);
      inputs.push_back(random_inputs(m, 100 + static_cast<std::uint64_t>(j)));
      const std::size_t n = inputs.back().size();
      src.push_back(test::to_device(inputs.back(), ctx));
      dst.push_back(test::sentinel_buffer<float>(n, ctx));
      half.push_back(test::sentinel_buffer<std::uint16_t>(n, ctx));
      const bool in_place = j == 11;
      const bool with_half = half_type != cuda::DeviceType::f32 && j % 2 == 0;
      jobs.push_back({src.back().data(), in_place ? src.back().data() : dst.back().data(),
                      with_half ? half.back().data() : nullptr, n, with_half ? half_type : cuda::DeviceType::f32});
    }
    const long long before = test::kernel_launches();
    cuda::round_copies(jobs.data(), jobs.size(), k.format, k.opt, ctx.stream());
    if (before >= 0) CHECK(test::kernel_launches() - before == 2);
    for (int j = 0; j < kJobs; ++j) {
      INFO("tensor " << j << " of " << inputs[static_cast<std::size_t>(j)].size() << " values");
      const std::vector<float>& in = inputs[static_cast<std::size_t>(j)];
      std::vector<float> expected(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) expected[i] = quantize(in[i], k.format, k.opt);
      const std::vector<float> got =
          test::to_host(j == 11 ? src[static_cast<std::size_t>(j)] : dst[static_cast<std::size_t>(j)], ctx);
      CHECK(bit_mismatches(got, expected).empty());
      if (jobs[static_cast<std::size_t>(j)].half != nullptr) {
        const std::vector<std::uint16_t> bits = test::to_host(half[static_cast<std::size_t>(j)], ctx);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < in.size(); ++i) bad += bits[i] != encode(expected[i], k.format);
        CHECK(bad == 0);
      }
    }
  }
  // A job with a null pointer, or a 16-bit copy of another type, is refused by its index, before any
  // job is launched.
  float none = 0;
  std::uint16_t bits = 0;
  const cuda::CopyJob null_src{nullptr, &none, nullptr, 4, cuda::DeviceType::f32};
  const cuda::CopyJob fine{&none, &none, nullptr, 1, cuda::DeviceType::f32};
  const cuda::CopyJob bad_half{&none, &none, &bits, 1, cuda::DeviceType::f32};
  const std::vector<cuda::CopyJob> a = {fine, null_src}, b = {bad_half};
  const long long before = test::kernel_launches();
  CHECK_THROWS_WITH(cuda::round_copies(a.data(), a.size(), Format::fp16, {}, ctx.stream()),
                    Contains("job 1") && Contains("null pointer"));
  if (before >= 0) CHECK(test::kernel_launches() == before);
  CHECK_THROWS_WITH(cuda::round_copies(b.data(), b.size(), Format::fp16, {}, ctx.stream()),
                    Contains("job 0") && Contains("f16 or bf16"));
}
