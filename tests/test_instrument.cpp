// The underflow instrumentation (SPEC §3) against a plain fp64 reference built from quantize() value
// by value: class counts, binade histogram and moments, on wide-range, empty and non-finite tensors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"

using namespace gradscale;

namespace {

// The obvious, slow definition: classify each value by what quantize() does to it.
TensorStats reference_stats(const std::vector<float>& v, Format f, RoundOptions opt = {}) {
  TensorStats s;
  const FormatInfo& fi = format_info(f);
  RoundOptions as_nan = opt;
  as_nan.e4m3_overflow_to_nan = true;
  double lo = INFINITY, hi = -INFINITY, amax = 0;
  for (float x : v) {
    ++s.elements;
    if (!std::isfinite(x)) {
      ++s.nonfinite;
      continue;
    }
    ++s.count;
    const double d = x;
    s.sum += d;
    s.sum_squares += d * d;
    lo = std::min(lo, d);
    hi = std::max(hi, d);
    amax = std::max(amax, std::fabs(d));
    if (x == 0.0f) {
      ++s.zero;
      continue;
    }
    const int e = static_cast<int>(std::floor(std::log2(std::fabs(d))));
    ++s.binades[static_cast<std::size_t>(std::clamp(e, kBinadeMin, kBinadeMax) - kBinadeMin)];
    const float r = quantize(x, f, as_nan);
    if (!std::isfinite(r))
      ++s.overflow;
    else if (r == 0.0f)
      ++s.underflow;
    else if (std::fabs(r) < fi.min_normal)
      ++s.subnormal;
    else
      ++s.normal;
  }
  if (s.count) {
    s.min = lo;
    s.max = hi;
    s.max_abs = amax;
  }
  return s;
}

void require_equal(const TensorStats& got, const TensorStats& ref) {
  REQUIRE(got.elements == ref.elements);
  REQUIRE(got.zero == ref.zero);
  REQUIRE(got.underflow == ref.underflow);
  REQUIRE(got.subnormal == ref.subnormal);
  REQUIRE(got.normal == ref.normal);
  REQUIRE(got.overflow == ref.overflow);
  REQUIRE(got.nonfinite == ref.nonfinite);
  REQUIRE(got.count == ref.count);
  for (int e = kBinadeMin; e <= kBinadeMax; ++e) {
    INFO("binade " << e);
    REQUIRE(got.binade(e) == ref.binade(e));
  }
  REQUIRE(got.min == ref.min);
  REQUIRE(got.max == ref.max);
  REQUIRE(got.max_abs == ref.max_abs);
  // Sums are added in a different order: a relative 1e-12 is far below float input resolution.
  REQUIRE(got.sum == Approx(ref.sum).epsilon(1e-12).margin(1e-300));
  REQUIRE(got.sum_squares == Approx(ref.sum_squares).epsilon(1e-12).margin(1e-300));
}

std::vector<float> wide_range(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log2mag(-40.0, 20.0);
  std::vector<float> v(n);
  for (auto& x : v) {
    const auto r = rng();
    x = static_cast<float>(std::exp2(log2mag(rng))) * ((r & 1) ? -1.0f : 1.0f);
    if ((r & 0xF0) == 0) x = 0.0f;
  }
  return v;
}

}  // namespace

TEST_CASE("tensor_stats equals the fp64 reference on tensors spanning 2^-40 .. 2^20", "[instrument]") {
  for (Format f : all_formats()) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{2048}, std::size_t{100001}}) {
      INFO(format_name(f) << ", n = " << n);
      const auto v = wide_range(n, n * 31 + static_cast<std::size_t>(f));
      require_equal(tensor_stats(v.data(), v.size(), f), reference_stats(v, f));
    }
  }
  const auto v = wide_range(50000, 3);
  const auto s = tensor_stats(v.data(), v.size(), Format::fp16);
  REQUIRE(s.underflow > 0);  // the data really exercises every class
  REQUIRE(s.subnormal > 0);
  REQUIRE(s.overflow > 0);
  REQUIRE(s.zero > 0);
}

TEST_CASE("tensor_stats split over any number of threads reads every value", "[instrument]") {
  // A large tensor is cut into t parts of whole blocks of 2048. With n = t·2^k + r (r < t) the parts
  // must still reach the last r values: 2^17 + 3 over 16 threads is 16 parts of 8192 and a tail of 3.
  const int saved = omp_get_max_threads();
  for (int t : {2, 3, 7, 16}) {
    omp_set_num_threads(t);
    for (std::size_t n : {(std::size_t{1} << 17) + 3, (std::size_t{1} << 18) + 13, std::size_t{300007}}) {
      INFO(t << " threads, n = " << n);
      const auto v = wide_range(n, n + static_cast<std::size_t>(t));
      const TensorStats s = tensor_stats(v.data(), v.size(), Format::fp16);
      CHECK(s.elements == n);
      require_equal(s, reference_stats(v, Format::fp16));
      CHECK(tensor_moments(v.data(), v.size()).elements == n);
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("tensor_stats bins float subnormals in their own binades, in whichever part of a split they lie",
          "[instrument]") {
  // The pass counts exponent fields and finds the float subnormals (field 0, as zeros are) only when
  // field 0 holds more values than the zeros: a few of them, in one block or one thread's part, count.
  const float tiny[] = {std::numeric_limits<float>::denorm_min(), 0x1p-130f, -0x1p-140f,
                        std::nextafter(std::numeric_limits<float>::min(), 0.0f)};
  const int saved = omp_get_max_threads();
  for (int t : {1, 3}) {
    omp_set_num_threads(t);
    for (std::size_t n : {std::size_t{5}, std::size_t{2049}, (std::size_t{1} << 17) + 5}) {
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        INFO(t << " threads, n = " << n << ", subnormals from " << at);
        auto v = wide_range(n, n + at);
        for (std::size_t k = 0; k < 4 && at + k < n; ++k) v[at + k] = tiny[k];
        const TensorStats s = tensor_stats(v.data(), v.size(), Format::fp16);
        require_equal(s, reference_stats(v, Format::fp16));
        const std::uint64_t tiny_bins = s.binade(-149) + s.binade(-130) + s.binade(-140) + s.binade(-127);
        CHECK(tiny_bins == std::min<std::size_t>(4, n - at));
      }
    }
  }
  omp_set_num_threads(saved);
  std::vector<float> zeros(4096, 0.0f);  // field 0 all zeros: no subnormal
  const TensorStats z = tensor_stats(zeros.data(), zeros.size(), Format::fp16);
  CHECK(z.zero == 4096);
  for (int e = kBinadeMin; e <= kBinadeMax; ++e) CHECK(z.binade(e) == 0);
}

TEST_CASE("tensor_stats equals the fp64 reference on random bit patterns: NaN, infinities, subnormals, zeros",
          "[instrument]") {
  // Every float class in one tensor, in every position of a block and of a thread's part.
  std::mt19937 rng(11);
  const int saved = omp_get_max_threads();
  for (int t : {1, 3}) {
    omp_set_num_threads(t);
    for (std::size_t n : {std::size_t{1}, std::size_t{2047}, std::size_t{2048}, std::size_t{4099},
                          (std::size_t{1} << 17) + 7}) {
      std::vector<float> v(n);
      for (float& x : v) {
        std::uint32_t bits = rng();
        if (bits % 7 == 0) bits &= 0x807FFFFFu;  // a zero or a float subnormal, either sign
        std::memcpy(&x, &bits, sizeof x);
      }
      for (Format f : {Format::fp16, Format::fp8_e4m3}) {
        INFO(t << " threads, n = " << n << ", " << format_name(f));
        require_equal(tensor_stats(v.data(), v.size(), f), reference_stats(v, f));
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("tensor_stats: empty tensor, NaN and infinities", "[instrument]") {
  const auto empty = tensor_stats(nullptr, 0, Format::fp16);
  CHECK(empty.elements == 0);
  CHECK(empty.count == 0);
  CHECK(empty.sum == 0.0);
  CHECK(empty.underflow_rate() == 0.0);
  CHECK(empty.mean() == 0.0);

  std::vector<float> v = {1.0f, std::nanf(""), -INFINITY, INFINITY,      -2.0f,
                          0.0f, 0x1p-30f,      1e5f,      -std::nanf("")};
  for (Format f : all_formats()) {
    INFO(format_name(f));
    const auto s = tensor_stats(v.data(), v.size(), f);
    require_equal(s, reference_stats(v, f));
    CHECK(s.nonfinite == 4);
    CHECK(std::isfinite(s.sum));
    CHECK(s.max_abs == 1e5f);
  }
  const auto s16 = tensor_stats(v.data(), v.size(), Format::fp16);
  CHECK(s16.underflow == 1);  // 2^-30
  CHECK(s16.overflow == 1);   // 1e5 > 65504
  CHECK(s16.zero == 1);
  CHECK(s16.normal == 2);
  CHECK(s16.underflow_rate() == Approx(1.0 / 4.0));

  const std::vector<float> all_nan(3000, std::nanf(""));
  const auto sn = tensor_stats(all_nan.data(), all_nan.size(), Format::fp16);
  CHECK(sn.nonfinite == 3000);
  CHECK(sn.count == 0);
  CHECK(sn.min == 0.0);
}

TEST_CASE("tensor_stats: class boundaries are exactly quantize()'s", "[instrument]") {
  // Values on and next to every threshold, for every format (and e4m3's NaN option).
  for (Format f : all_formats()) {
    for (bool nan_opt : {false, true}) {
      const RoundOptions opt{nan_opt};
      const RoundThresholds t = round_thresholds(f, opt);
      std::vector<float> v;
      for (std::uint32_t b : {t.first_nonzero, t.first_normal, t.first_overflow}) {
        for (std::int64_t d = -2; d <= 2; ++d) {
          const auto bb = static_cast<std::uint32_t>(std::clamp<std::int64_t>(b + d, 0, 0x7F800000));
          float x;
          std::memcpy(&x, &bb, sizeof x);
          v.push_back(x);
          v.push_back(-x);
        }
      }
      INFO(format_name(f) << (nan_opt ? " (nan option)" : ""));
      require_equal(tensor_stats(v.data(), v.size(), f, opt), reference_stats(v, f, opt));
    }
  }
  // Known thresholds of fp16: 2^-25 underflows, the next float does not; 65520 overflows.
  const RoundThresholds t = round_thresholds(Format::fp16);
  float x;
  std::memcpy(&x, &t.first_nonzero, sizeof x);
  CHECK(x == std::nextafter(0x1p-25f, 1.0f));
  std::memcpy(&x, &t.first_overflow, sizeof x);
  CHECK(x == 65520.0f);
  CHECK(classify_rounding(0x1p-25f, Format::fp16) == RoundClass::underflow);
  CHECK(classify_rounding(464.0f, Format::fp8_e4m3) == RoundClass::normal);
  CHECK(classify_rounding(465.0f, Format::fp8_e4m3) == RoundClass::overflow);
}

TEST_CASE("tensor_stats: merge and JSON", "[instrument]") {
  const auto a = wide_range(3000, 11), b = wide_range(5000, 12);
  std::vector<float> ab(a);
  ab.insert(ab.end(), b.begin(), b.end());
  auto s = tensor_stats(a.data(), a.size(), Format::bf16);
  s.merge(tensor_stats(b.data(), b.size(), Format::bf16));
  require_equal(s, reference_stats(ab, Format::bf16));
  const auto j = stats_to_json(s, true);
  CHECK(j["elements"] == 8000);
  CHECK(j["underflow"] == s.underflow);
  std::uint64_t total = 0;
  for (const auto& [k, c] : j["binades"].items()) total += c.get<std::uint64_t>();
  CHECK(total == s.nonzero_finite());
}
