// Tests of lib/cuda's statistics and found_inf against lib/instrument (built only with CUDA; a case that
// needs a GPU skips visibly without one): tensor_stats counts and bins exactly, sums within SPEC §3's 1e-6;
// measure_and_round and tensor_stats with a decision against the separate passes, bit for bit;
// max_abs_bits, count_about_edge, first_nonfinite; the fused unscale + found_inf flag.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
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
#include "lib/cuda/elementwise.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/local_scale.h"
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
#include "tests/cuda_format_cases.h"
#include "tests/cuda_test.h"

using namespace gradscale;
using Catch::Matchers::Contains;
using test::bit_mismatches;
using test::bits_of;
using test::float_of;
using namespace gradscale::test::cuda_fixtures;

namespace {

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
// binade, float subnormals, zeros, NaN/inf with payloads and signs), values crowded in three binades, values
// packed around each format's underflow and overflow thresholds, and sizes that are no multiple of any block size.
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
  // Crowded, as gradients are: nearly every value in one of three binades, so the lanes of a warp share
  // their binade's counter (the kernel adds each group's count once); zeros and a tail of 13.
  std::vector<float> crowded(test::gpu_or_cpu_target<std::size_t>((std::size_t{1} << 22) + 13, (std::size_t{1} << 16) + 13));
  for (float& x : crowded) {
    const double u = uniform01(rng);
    x = u < 0.02 ? 0.0f : static_cast<float>(std::exp2(-20.0 + 3.0 * uniform01(rng)) * (rng() & 1 ? 1.0 : -1.0));
  }
  t.push_back(crowded);
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

}  // namespace

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

TEST_CASE("cuda::measure_and_round is the multiplication, tensor_stats and quantize in one pass, bit for bit",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::mt19937_64 rng(41);
  // Mixed values (zeros, NaNs with payloads, infs, float subnormals, 2^-150..2^129), several grid-stride
  // passes per thread with a tail the unrolled loop leaves, and one of a few elements.
  std::vector<std::vector<float>> tensors;
  for (std::size_t n :
       {std::size_t{5}, std::size_t{4099}, test::gpu_or_cpu_target<std::size_t>((1u << 21) + 3, 70001)}) {
    std::vector<float> v(n);
    for (float& x : v) {
      const double u = uniform01(rng);
      if (u < 0.05)
        x = 0.0f;
      else if (u < 0.052)
        x = float_of(0x7F800001u | static_cast<std::uint32_t>(rng() & 0x807FFFFFu));
      else if (u < 0.054)
        x = rng() & 1 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
      else if (u < 0.06)
        x = float_of(static_cast<std::uint32_t>(rng() & 0x807FFFFFu));
      else
        x = static_cast<float>(std::exp2(-150.0 + 279.0 * uniform01(rng)) * (rng() & 1 ? 1.0 : -1.0));
    }
    tensors.push_back(v);
  }
  // 1 (no product), powers of two both ways (into overflow and below the subnormals), and 3 (inexact).
  const std::vector<float> multipliers = {1.0f, 0x1p-9f, 0x1p24f, 3.0f};
  SECTION("against the unfused passes, and against lib/numeric and lib/instrument") {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::vector<float>& host = tensors[t];
      const std::size_t n = host.size();
      const auto src = test::to_device(host, ctx);
      for (const FormatCase& fc : format_cases()) {
        for (float m : multipliers) {
          for (bool round : {true, false}) {
            for (bool on_device : {false, true}) {
              const bool in_place = (t + static_cast<std::size_t>(on_device)) % 2 == 0;
              INFO("tensor " << t << " (" << n << " values), " << fc.name() << ", multiplier " << m
                             << (on_device ? " from the device" : "")
                             << (round ? ", rounded" : ", not rounded") << (in_place ? ", in place" : ""));
              // The unfused passes: the multiplication, the statistics, the rounding.
              cuda::DeviceBuffer<float> want(n);
              const auto entry = test::to_device(std::vector<cuda::DeviceScale>{{5.0, m, 7.0, 0}}, ctx);
              if (on_device)
                cuda::apply_local_scale(src.data(), want.data(), n, entry.data(), ctx.stream());
              else
                cuda::quantize(src.data(), want.data(), n, Format::fp32, fc.round, m, ctx.stream());
              auto want_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
              cuda::tensor_stats(ctx, want.data(), n, fc.format, fc.round, want_stats.data());
              if (round) cuda::quantize(want.data(), want.data(), n, fc.format, fc.round, 1.0f, ctx.stream());
              // The one pass.
              auto got = test::sentinel_buffer<float>(n, ctx);
              if (in_place) got = test::to_device(host, ctx);
              auto got_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
              cuda::StoredRounding stored{got.data(), round, on_device ? 1.0f : m, nullptr};
              if (on_device) stored.device_multiplier = &entry.data()->local;
              cuda::measure_and_round(ctx, {in_place ? got.data() : src.data(), n, fc.format, fc.round},
                                      stored, got_stats.data());
              const std::vector<cuda::DeviceStats> a = test::to_host(got_stats, ctx),
                                                   b = test::to_host(want_stats, ctx);
              CHECK(std::memcmp(a.data(), b.data(), sizeof(cuda::DeviceStats)) == 0);
              const std::vector<float> got_host = test::to_host(got, ctx),
                                       want_host = test::to_host(want, ctx);
              CHECK(bit_mismatches(got_host, want_host, &host) == "");
              // And against lib/numeric and lib/instrument directly: the product in fp32, then quantize().
              std::vector<float> v(host);
              for (float& x : v) x = m == 1.0f ? x : x * m;
              const TensorStats cpu = tensor_stats(v.data(), n, fc.format, fc.round);
              check_stats_equal(cuda::to_tensor_stats(a[0]), cpu, v, "against lib/instrument");
              if (round)
                for (float& x : v) x = quantize(x, fc.format, fc.round);
              std::size_t differ = 0;  // NaNs: a multiplication may canonicalise them (cuda::quantize's note)
              for (std::size_t i = 0; i < n; ++i)
                differ +=
                    !(bits_of(got_host[i]) == bits_of(v[i]) || (std::isnan(got_host[i]) && std::isnan(v[i])));
              CHECK(differ == 0);
            }
          }
        }
      }
    }
  }
  SECTION("nothing to store: the values stay as they were, the statistics are tensor_stats's") {
    auto d = test::to_device(tensors[1], ctx);
    auto a = test::sentinel_buffer<cuda::DeviceStats>(1, ctx),
         b = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    cuda::measure_and_round(ctx, {d.data(), tensors[1].size(), Format::fp32, {}},
                            {d.data(), true, 1.0f, nullptr}, a.data());
    cuda::tensor_stats(ctx, d.data(), tensors[1].size(), Format::fp32, {}, b.data());
    const auto ha = test::to_host(a, ctx), hb = test::to_host(b, ctx);
    CHECK(std::memcmp(ha.data(), hb.data(), sizeof(cuda::DeviceStats)) == 0);
    CHECK(bit_mismatches(test::to_host(d, ctx), tensors[1]) == "");
  }
  SECTION("a null destination is named") {
    const auto d = test::to_device(tensors[0], ctx);
    auto a = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    CHECK_THROWS_WITH(cuda::measure_and_round(ctx, {d.data(), 5, Format::fp16, {}},
                                              {nullptr, true, 2.0f, nullptr}, a.data()),
                      Contains("measure_and_round") && Contains("null"));
  }
  SECTION("with a master: the unscale_accumulate of what it stores, in the same pass, found_inf included") {
    // A finite gradient (the flag stays clear) and the mixed one (NaNs and infs set it); S on the host, on
    // the device, and one outside float32's normal range (sets the flag, accumulates as unscale does).
    std::vector<float> finite = tensors[2];
    for (float& x : finite)
      if (!std::isfinite(x) || std::fabs(x) > 1e4f) x = 0.25f;  // and no overflow in fp16
    const std::vector<float> master0 = [&] {
      std::vector<float> m(finite.size());
      for (std::size_t i = 0; i < m.size(); ++i)
        m[i] = static_cast<float>(std::sin(static_cast<double>(i))) * 1e-3f;
      return m;
    }();
    for (const std::vector<float>* host : {&finite, &tensors[2]}) {
      for (int how = 0; how < 3; ++how) {
        INFO((host == &finite ? "finite" : "with NaNs and infs")
             << ", S "
             << (how == 0   ? "on the host"
                 : how == 1 ? "on the device"
                            : "out of range, on the device"));
        const std::size_t n = host->size();
        const double scale = how == 2 ? 1e-300 : 1024.0;
        const auto entry = test::to_device(std::vector<cuda::DeviceScale>{{scale, 0x1p-3, 1, 0}}, ctx);
        // Separately: measure_and_round, then unscale_accumulate.
        auto want = test::to_device(*host, ctx), want_master = test::to_device(master0, ctx);
        auto want_flag = test::to_device(std::vector<int>{0}, ctx);
        auto want_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
        cuda::measure_and_round(ctx, {want.data(), n, Format::fp16, {}}, {want.data(), true, 0.5f, nullptr},
                                want_stats.data());
        cuda::UnscaleJob job{want.data(), want_master.data(), n, scale};
        if (how > 0) job.scale_on_device = &entry.data()->scale;
        cuda::unscale_accumulate(&job, 1, want_flag.data(), ctx.stream());
        // In one pass.
        auto got = test::to_device(*host, ctx), got_master = test::to_device(master0, ctx);
        auto got_flag = test::to_device(std::vector<int>{0}, ctx);
        auto got_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
        cuda::StoredRounding stored{got.data(), true, 0.5f, nullptr};
        stored.master = got_master.data();
        stored.scale = scale;
        if (how > 0) stored.device_scale = &entry.data()->scale;
        stored.found_inf = got_flag.data();
        cuda::measure_and_round(ctx, {got.data(), n, Format::fp16, {}}, stored, got_stats.data());
        CHECK(bit_mismatches(test::to_host(got, ctx), test::to_host(want, ctx)) == "");
        CHECK(bit_mismatches(test::to_host(got_master, ctx), test::to_host(want_master, ctx)) == "");
        const int flag = test::to_host(got_flag, ctx)[0];
        CHECK(flag == test::to_host(want_flag, ctx)[0]);
        CHECK(flag == (host == &finite && how < 2 ? 0 : 1));
        const auto a = test::to_host(got_stats, ctx), b = test::to_host(want_stats, ctx);
        CHECK(std::memcmp(a.data(), b.data(), sizeof(cuda::DeviceStats)) == 0);
      }
    }
    auto d = test::to_device(tensors[0], ctx), m = test::to_device(tensors[0], ctx);
    auto a = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    cuda::StoredRounding stored{d.data(), true, 1.0f, nullptr};
    stored.master = m.data();
    CHECK_THROWS_WITH(cuda::measure_and_round(ctx, {d.data(), 5, Format::fp16, {}}, stored, a.data()),
                      Contains("found_inf"));
    auto flag = test::to_device(std::vector<int>{0}, ctx);
    stored.found_inf = flag.data();
    stored.scale = 0;
    CHECK_THROWS_AS(cuda::measure_and_round(ctx, {d.data(), 5, Format::fp16, {}}, stored, a.data()),
                    NumericError);
  }
  SECTION("a weight gradient's r decided in the same launch: the two launches' entry, record and values") {
    // Tensors of one block's values or fewer (the first 5 and 1 000 mixed values, with NaNs and infs; a
    // finite one; an all-zero one), with a master or a division by r·S_in.
    std::vector<float> finite = tensors[1];
    for (float& x : finite)
      if (!std::isfinite(x) || std::fabs(x) > 1e4f) x = 0.375f;
    finite.resize(1000);
    const std::vector<std::vector<float>> small = {tensors[0], std::vector<float>(tensors[1].begin(), tensors[1].begin() + 1000),
                                                   finite, std::vector<float>(cuda::one_block_values(), 0.0f)};
    for (std::size_t t = 0; t < small.size(); ++t) {
      for (bool into_master : {true, false}) {
        INFO("tensor " << t << " (" << small[t].size() << " values), " << (into_master ? "into a master" : "divided"));
        const std::size_t n = small[t].size();
        const std::vector<float> master0(n, 0.125f);
        const auto in = test::to_device(std::vector<cuda::DeviceScale>{{8.0, 1, 1, 0}}, ctx);
        auto entry_a = test::sentinel_buffer<cuda::DeviceScale>(1, ctx), entry_b = test::sentinel_buffer<cuda::DeviceScale>(1, ctx);
        const auto stored_for = [&](float* dst, float* master, int* flag, cuda::DeviceScale* e) {
          cuda::StoredRounding s{dst, true, 1.0f, &e->local};
          if (into_master) {
            s.master = master;
            s.device_scale = &e->scale;
            s.found_inf = flag;
          } else {
            s.device_divisor = &e->scale;
          }
          return s;
        };
        // Two launches: r from tensor_stats's record, then the rounding at r.
        auto a = test::to_device(small[t], ctx), ma = test::to_device(master0, ctx);
        auto fa = test::to_device(std::vector<int>{0}, ctx);
        auto sa = test::sentinel_buffer<cuda::DeviceStats>(2, ctx);
        const cuda::StatsJob ja{a.data(), n, Format::fp16, {}};
        cuda::tensor_stats(ctx, &ja, 1, sa.data() + 1,
                           cuda::StatsDecision::weight_grad_scale(65504.0, in.data(), entry_a.data()));
        cuda::measure_and_round(ctx, ja, stored_for(a.data(), ma.data(), fa.data(), entry_a.data()), sa.data());
        // One launch.
        auto b = test::to_device(small[t], ctx), mb = test::to_device(master0, ctx);
        auto fb = test::to_device(std::vector<int>{0}, ctx);
        auto sb = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
        const cuda::WeightGradDecision r{65504.0, in.data(), entry_b.data()};
        cuda::StoredRounding one = stored_for(b.data(), mb.data(), fb.data(), entry_b.data());
        one.decides_r = &r;
        const long long before = test::kernel_launches();
        cuda::measure_and_round(ctx, {b.data(), n, Format::fp16, {}}, one, sb.data());
        if (before >= 0) CHECK(test::kernel_launches() - before == 1);
        const auto ea = test::to_host(entry_a, ctx), eb = test::to_host(entry_b, ctx);
        CHECK(std::memcmp(ea.data(), eb.data(), sizeof(cuda::DeviceScale)) == 0);
        CHECK(ea[0].local == eb[0].local);  // (named in a failure)
        const auto ra = test::to_host(sa, ctx), rb = test::to_host(sb, ctx);
        CHECK(std::memcmp(&ra[0], &rb[0], sizeof(cuda::DeviceStats)) == 0);
        CHECK(bit_mismatches(test::to_host(b, ctx), test::to_host(a, ctx), &small[t]) == "");
        CHECK(bit_mismatches(test::to_host(mb, ctx), test::to_host(ma, ctx)) == "");
        CHECK(test::to_host(fb, ctx)[0] == test::to_host(fa, ctx)[0]);
      }
    }
    auto big = test::to_device(std::vector<float>(cuda::one_block_values() + 1, 1.0f), ctx);
    auto e = test::sentinel_buffer<cuda::DeviceScale>(1, ctx);
    const auto in = test::to_device(std::vector<cuda::DeviceScale>{{8.0, 1, 1, 0}}, ctx);
    auto st = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    const cuda::WeightGradDecision r{65504.0, in.data(), e.data()};
    cuda::StoredRounding over{big.data(), true, 1.0f, &e.data()->local};
    over.decides_r = &r;
    CHECK_THROWS_WITH(cuda::measure_and_round(ctx, {big.data(), cuda::one_block_values() + 1, Format::fp16, {}}, over,
                                              st.data()),
                      Contains("one block"));
  }
  SECTION("divided after the rounding: cuda::divide's or divide_by_scale's bits, in the same pass") {
    // Two of the mixed tensors (NaNs, infs, subnormals); divisors a power of two and an inexact 3 on the
    // host, and on the device an S inside float32's range and two outside it (left undivided).
    for (std::size_t t : {std::size_t{1}, std::size_t{2}}) {
      const std::vector<float>& host = tensors[t];
      const std::size_t n = host.size();
      for (int how = 0; how < 5; ++how) {
        const double divisor = how == 0 ? 1024.0 : how == 1 ? 3.0 : how == 2 ? 0x1p-20 : how == 3 ? 1e-300 : 1e300;
        const bool on_device = how >= 2;
        for (bool multiplier_on_device : {false, true}) {
          INFO("tensor " << t << ", divisor " << divisor << (on_device ? " from the device" : "")
                         << (multiplier_on_device ? ", multiplier from the device" : ""));
          const auto entry = test::to_device(std::vector<cuda::DeviceScale>{{divisor, 0x1p-3, 1, 0}}, ctx);
          // Separately: measure_and_round, then the division's own kernel.
          auto want = test::to_device(host, ctx);
          auto want_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
          cuda::StoredRounding plain{want.data(), true, multiplier_on_device ? 1.0f : 0.5f, nullptr};
          if (multiplier_on_device) plain.device_multiplier = &entry.data()->local;
          cuda::measure_and_round(ctx, {want.data(), n, Format::fp16, {}}, plain, want_stats.data());
          if (on_device)
            cuda::divide_by_scale(want.data(), n, entry.data(), ctx.stream());
          else
            cuda::divide(want.data(), n, static_cast<float>(divisor), ctx.stream());
          // In one pass, from a source (not in place).
          const auto src = test::to_device(host, ctx);
          auto got = test::sentinel_buffer<float>(n, ctx);
          auto got_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
          cuda::StoredRounding stored = plain;
          stored.dst = got.data();
          if (on_device) {
            stored.device_divisor = &entry.data()->scale;
          } else {
            stored.divide = true;
            stored.divisor = static_cast<float>(divisor);
          }
          cuda::measure_and_round(ctx, {src.data(), n, Format::fp16, {}}, stored, got_stats.data());
          CHECK(bit_mismatches(test::to_host(got, ctx), test::to_host(want, ctx), &host) == "");
          const auto a = test::to_host(got_stats, ctx), b = test::to_host(want_stats, ctx);
          CHECK(std::memcmp(a.data(), b.data(), sizeof(cuda::DeviceStats)) == 0);
        }
      }
    }
    auto d = test::to_device(tensors[1], ctx), m = test::to_device(tensors[1], ctx);
    auto flag = test::to_device(std::vector<int>{0}, ctx);
    auto a = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    cuda::StoredRounding both{d.data(), true, 1.0f, nullptr};
    both.master = m.data();
    both.found_inf = flag.data();
    both.divide = true;
    both.divisor = 2.0f;
    CHECK_THROWS_WITH(cuda::measure_and_round(ctx, {d.data(), 1, Format::fp16, {}}, both, a.data()),
                      Contains("divided or unscaled into a master, not both"));
  }
}

TEST_CASE(
    "cuda::tensor_stats with a decision takes local_scale.h's decision in the statistics' launch, bit for "
    "bit",
    "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::mt19937_64 rng(7);
  // g, W and an upstream product of gradient-like magnitudes (several blocks each, sizes apart).
  const auto draw = [&](std::size_t n, double lo, double hi) {
    std::vector<float> v(n);
    for (float& x : v)
      x = uniform01(rng) < 0.03
              ? 0.0f
              : static_cast<float>(std::exp2(lo + (hi - lo) * uniform01(rng)) * (rng() & 1 ? 1.0 : -1.0));
    return v;
  };
  const std::vector<std::vector<float>> host = {
      draw(test::gpu_or_cpu_target<std::size_t>(300007, 40009), -30, -8), draw(2311, -9, -2),
      draw(test::gpu_or_cpu_target<std::size_t>(500009, 30011), -34, -6)};
  std::vector<cuda::DeviceBuffer<float>> data;
  for (const auto& h : host) data.push_back(test::to_device(h, ctx));
  const Format f = Format::fp16;
  const auto job = [&](std::size_t i) {
    return cuda::job_of(data[i].data(), static_cast<std::int64_t>(host[i].size()), f, {});
  };
  const FormatInfo& fi = format_info(f);
  ScaleRule rule;
  rule.reduction = 512;
  rule.params.u_min = fi.min_subnormal;
  rule.params.u_max = fi.max_finite;
  rule.params.c = 3.29;
  rule.bounds.accum_upper_bound = 1e30;
  rule.bounds.scale_upper_bound = 1e30;
  const auto in = test::to_device(std::vector<cuda::DeviceScale>{{8.0, 1, 1, 0}}, ctx);
  // The decision in the statistics' launch against tensor_stats and the decision's own kernel.
  const auto compare =
      [&](const std::vector<cuda::StatsJob>& jobs, cuda::StatsDecision d,
          const std::function<void(const cuda::DeviceStats*, cuda::DeviceScale*)>& separately) {
        auto got = test::sentinel_buffer<cuda::DeviceScale>(1, ctx),
             want = test::sentinel_buffer<cuda::DeviceScale>(1, ctx);
        auto got_stats = test::sentinel_buffer<cuda::DeviceStats>(jobs.size(), ctx);
        auto want_stats = test::sentinel_buffer<cuda::DeviceStats>(jobs.size(), ctx);
        d.out = got.data();
        cuda::tensor_stats(ctx, jobs.data(), jobs.size(), got_stats.data(), d);
        cuda::tensor_stats(ctx, jobs, want_stats.data());
        separately(want_stats.data(), want.data());
        const auto a = test::to_host(got, ctx), b = test::to_host(want, ctx);
        CHECK(std::memcmp(a.data(), b.data(), sizeof(cuda::DeviceScale)) == 0);
        CHECK(a[0].local == b[0].local);  // (named in a failure)
        CHECK(std::isfinite(a[0].scale));
        CHECK(a[0].unbound == b[0].unbound);
        // The statistics are tensor_stats's.
        std::vector<cuda::DeviceStats> sa = test::to_host(got_stats, ctx),
                                       sb = test::to_host(want_stats, ctx);
        CHECK(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(cuda::DeviceStats)) == 0);
      };
  cuda::StatsDecision d;
  d.in = in.data();
  SECTION("a local scale from the moments of g and W (approx_range, abs_range), g and W in either order") {
    for (int formula : {int{ScaleRule::kApproxRange}, int{ScaleRule::kAbsRange}}) {
      for (bool swapped : {false, true}) {
        INFO("formula " << formula << (swapped ? ", W first" : ""));
        rule.formula = formula;
        d.kind = cuda::StatsDecision::kLocalScale;
        d.rule = rule;
        d.grad = swapped ? 1 : 0;
        d.weight = swapped ? 0 : 1;
        const std::vector<cuda::StatsJob> jobs = swapped ? std::vector<cuda::StatsJob>{job(1), job(0)}
                                                         : std::vector<cuda::StatsJob>{job(0), job(1)};
        compare(jobs, d, [&](const cuda::DeviceStats* s, cuda::DeviceScale* out) {
          cuda::decide_local_scale(rule, s + d.grad, s + d.weight, nullptr, in.data(), out, ctx.stream());
        });
      }
    }
  }
  SECTION(
      "a local scale from the upstream product's bins (measured), with and without the moments' tensors") {
    rule.formula = ScaleRule::kMeasured;
    d.kind = cuda::StatsDecision::kLocalScale;
    d.rule = rule;
    d.upstream = 0;
    compare({job(2)}, d, [&](const cuda::DeviceStats* s, cuda::DeviceScale* out) {
      cuda::decide_local_scale(rule, nullptr, nullptr, s, in.data(), out, ctx.stream());
    });
    d.grad = 0;
    d.weight = 1;
    d.upstream = 2;
    compare({job(0), job(1), job(2)}, d, [&](const cuda::DeviceStats* s, cuda::DeviceScale* out) {
      cuda::decide_local_scale(rule, s, s + 1, s + 2, in.data(), out, ctx.stream());
    });
  }
  // The host's own formulas (lib/scaler/scale_rule.h) on the statistics the device computed.
  const auto stats_on_host = [&](const cuda::DeviceStats* s, std::size_t count) {
    std::vector<cuda::DeviceStats> h(count);
    GS_CUDA_CHECK(cudaMemcpy(h.data(), s, count * sizeof(cuda::DeviceStats), cudaMemcpyDeviceToHost));
    return h;
  };
  const auto put = [&](cuda::DeviceScale* out, const cuda::DeviceScale& v) {
    GS_CUDA_CHECK(cudaMemcpy(out, &v, sizeof v, cudaMemcpyHostToDevice));
  };
  SECTION("a weight gradient's r, over one tensor and over two") {
    d.kind = cuda::StatsDecision::kWeightGradScale;
    d.u_max = fi.max_finite;
    for (const std::vector<cuda::StatsJob>& jobs : {std::vector<cuda::StatsJob>{job(1)}, {job(0), job(1)}}) {  // the larger maximum second
      compare(jobs, d, [&](const cuda::DeviceStats* s, cuda::DeviceScale* out) {
        double m = 0;
        for (const cuda::DeviceStats& h : stats_on_host(s, jobs.size()))
          m = h.nonfinite > 0 ? INFINITY : rule_max(m, h.max_abs);
        const double r = weight_grad_range_scale(m, fi.max_finite, 8.0);
        put(out, {r * 8.0, r, r, 0});
      });
    }
  }
  SECTION("each weight gradient's own r, a layer's gradients in one launch") {
    // Three tensors of different sizes and maxima in one launch: each outs[k] is what a launch over that
    // tensor alone decides (weight_grad_scale), bit for bit.
    const std::vector<cuda::StatsJob> jobs = {job(0), job(1), job(2)};
    auto got = test::sentinel_buffer<cuda::DeviceScale>(3, ctx), want = test::sentinel_buffer<cuda::DeviceScale>(3, ctx);
    auto stats = test::sentinel_buffer<cuda::DeviceStats>(3, ctx), alone = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
    cuda::DeviceScale* outs[3] = {got.data(), got.data() + 1, got.data() + 2};
    cuda::tensor_stats(ctx, jobs.data(), 3, stats.data(),
                       cuda::StatsDecision::weight_grad_scale_each(fi.max_finite, in.data(), outs, 3));
    for (std::size_t k = 0; k < 3; ++k)
      cuda::tensor_stats(ctx, &jobs[k], 1, alone.data(),
                         cuda::StatsDecision::weight_grad_scale(fi.max_finite, in.data(), want.data() + k));
    const auto a = test::to_host(got, ctx), b = test::to_host(want, ctx);
    for (std::size_t k = 0; k < 3; ++k) {
      INFO("tensor " << k);
      CHECK(std::memcmp(&a[k], &b[k], sizeof(cuda::DeviceScale)) == 0);
      CHECK(a[k].local == b[k].local);  // (named in a failure)
    }
    CHECK((a[0].local != a[1].local || a[1].local != a[2].local));  // the tensors' own r, not one r for all
    cuda::DeviceScale* missing[3] = {got.data(), nullptr, got.data() + 2};
    CHECK_THROWS_WITH(cuda::tensor_stats(ctx, jobs.data(), 3, stats.data(),
                                         cuda::StatsDecision::weight_grad_scale_each(fi.max_finite, in.data(), missing, 3)),
                      Contains("null scale entry"));
  }
  SECTION("S0 from the loss gradient's statistics") {
    d.kind = cuda::StatsDecision::kLossScale;
    d.in = nullptr;
    d.loss.params = rule.params;
    d.loss.phi = 2;
    d.loss.base_is_floor = true;
    compare({job(2)}, d, [&](const cuda::DeviceStats* s, cuda::DeviceScale* out) {
      const cuda::DeviceStats h = stats_on_host(s, 1)[0];
      const LossScaleDecision s0 = loss_scale_decision(d.loss, reinterpret_cast<const std::uint64_t*>(h.binades),
                                                       h.elements - h.zero - h.nonfinite, h.max_abs);
      put(out, {s0.s0, s0.s0, s0.floor, 0});
    });
  }
  SECTION("a decision that lacks what it reads, or reads too many tensors, is refused before any launch") {
    auto out = test::sentinel_buffer<cuda::DeviceScale>(1, ctx);
    auto stats = test::sentinel_buffer<cuda::DeviceStats>(4, ctx);
    d.out = out.data();
    d.kind = cuda::StatsDecision::kLocalScale;
    d.rule = rule;
    d.rule.formula = ScaleRule::kMeasured;
    const cuda::StatsJob one = job(0);
    CHECK_THROWS_WITH(cuda::tensor_stats(ctx, &one, 1, stats.data(), d),
                      Contains("reads the upstream statistics"));
    d.rule.formula = ScaleRule::kApproxRange;
    d.grad = 0;
    d.weight = 1;
    CHECK_THROWS_WITH(cuda::tensor_stats(ctx, &one, 1, stats.data(), d), Contains("moments of g and W"));
    const std::vector<cuda::StatsJob> four = {job(0), job(1), job(2), job(0)};
    CHECK_THROWS_WITH(cuda::tensor_stats(ctx, four.data(), 4, stats.data(), d), Contains("at most 3"));
    d.out = nullptr;
    CHECK_THROWS_WITH(cuda::tensor_stats(ctx, &one, 1, stats.data(), d), Contains("null scale entry"));
    CHECK(test::to_host(out, ctx)[0].scale !=
          test::to_host(out, ctx)[0].scale);  // the sentinel NaN: untouched
  }
}

TEST_CASE("cuda::col2im_measured writes col2im's sums and tensor_stats's statistics of them in one launch, bit "
          "for bit",
          "[cuda]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  std::mt19937_64 rng(11);
  // Strides 1 and 2 (and 3: taps that skip), paddings 0..2, kernels 1..5, planes of odd sizes, batches
  // whose element count leaves a tail; both column layouts.
  const std::vector<cuda::ConvGeometry> geometries = {
      {3, 4, 9, 7, 3, 1, 1}, {2, 3, 11, 10, 3, 2, 1}, {2, 2, 8, 9, 5, 1, 2}, {1, 5, 7, 7, 1, 1, 0},
      {2, 3, 13, 12, 3, 3, 0}, {test::gpu_or_cpu_target<std::int64_t>(64, 8), 16, 28, 28, 3, 1, 1}};
  const FormatInfo& fi = format_info(Format::fp16);
  int decided_above_1 = 0;  // decisions of their own, not S_in passed on
  for (const cuda::ConvGeometry& g : geometries) {
    for (cuda::ColumnLayout layout : {cuda::ColumnLayout::per_sample, cuda::ColumnLayout::batch_wide}) {
      INFO("n " << g.n << " C " << g.channels << " " << g.h << "x" << g.w << " k " << g.kernel << " stride "
                << g.stride << " pad " << g.pad << (layout == cuda::ColumnLayout::batch_wide ? ", batch-wide" : ""));
      std::vector<float> cols(static_cast<std::size_t>(g.n * g.col_rows() * g.col_cols()));
      for (float& x : cols)
        x = uniform01(rng) < 0.05 ? 0.0f
                                  : static_cast<float>(std::exp2(-40.0 + 36.0 * uniform01(rng)) * (rng() & 1 ? 1.0 : -1.0));
      const auto d_cols = test::to_device(cols, ctx);
      const auto n = static_cast<std::size_t>(g.n * g.channels * g.h * g.w);
      auto want = test::sentinel_buffer<float>(n, ctx), got = test::sentinel_buffer<float>(n, ctx);
      auto want_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
      auto got_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
      // measured's decision, as a convolution's controller takes it on the device.
      const auto in = test::to_device(std::vector<cuda::DeviceScale>{{4.0, 1, 1, 0}}, ctx);
      auto want_scale = test::sentinel_buffer<cuda::DeviceScale>(1, ctx), got_scale = test::sentinel_buffer<cuda::DeviceScale>(1, ctx);
      ScaleRule rule;
      rule.formula = ScaleRule::kMeasured;
      rule.reduction = static_cast<double>(g.col_rows());
      rule.params.u_min = fi.min_subnormal;
      rule.params.u_max = fi.max_finite;
      cuda::col2im(d_cols.data(), g, want.data(), ctx.stream(), layout);
      cuda::tensor_stats(ctx, want.data(), n, Format::fp16, {}, want_stats.data());
      cuda::decide_local_scale(rule, nullptr, nullptr, want_stats.data(), in.data(), want_scale.data(), ctx.stream());
      cuda::StatsDecision decision;
      decision.rule = rule;
      decision.upstream = 0;
      decision.in = in.data();
      decision.out = got_scale.data();
      const long long before = test::kernel_launches();
      cuda::col2im_measured(ctx, d_cols.data(), g, layout, got.data(), Format::fp16, {}, got_stats.data(), &decision);
      if (before >= 0) CHECK(test::kernel_launches() - before == 1);
      CHECK(bit_mismatches(test::to_host(got, ctx), test::to_host(want, ctx)) == "");
      const auto a = test::to_host(got_stats, ctx), b = test::to_host(want_stats, ctx);
      CHECK(std::memcmp(a.data(), b.data(), sizeof(cuda::DeviceStats)) == 0);
      const auto sa = test::to_host(got_scale, ctx), sb = test::to_host(want_scale, ctx);
      CHECK(std::memcmp(sa.data(), sb.data(), sizeof(cuda::DeviceScale)) == 0);
      decided_above_1 += sa[0].local > 1.0;
      // Without a decision: the same sums and statistics.
      auto plain = test::sentinel_buffer<float>(n, ctx);
      auto plain_stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
      cuda::col2im_measured(ctx, d_cols.data(), g, layout, plain.data(), Format::fp16, {}, plain_stats.data(), nullptr);
      CHECK(bit_mismatches(test::to_host(plain, ctx), test::to_host(want, ctx)) == "");
      const auto c = test::to_host(plain_stats, ctx);
      CHECK(std::memcmp(c.data(), b.data(), sizeof(cuda::DeviceStats)) == 0);
    }
  }
  CHECK(decided_above_1 >= 8);
  float none = 0;
  auto stats = test::sentinel_buffer<cuda::DeviceStats>(1, ctx);
  CHECK_THROWS_AS(cuda::col2im_measured(ctx, &none, {1, 1, 2, 2, 3, 1, 0}, cuda::ColumnLayout::per_sample, &none,
                                        Format::fp16, {}, stats.data(), nullptr),
                  ShapeError);
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
