// Where rounding to F cuts |v| (see round_thresholds.h): binary searches over quantize().
#include "lib/instrument/round_thresholds.h"

#include <array>
#include <cmath>
#include <cstring>

#include "lib/core/error.h"
#include "lib/instrument/float_bits.h"

namespace gradscale {
namespace {

// Smallest a in [lo, hi] (float bit patterns) with pred(a) true; hi when none is.
template <class Pred>
std::uint32_t first_true(std::uint32_t lo, std::uint32_t hi, Pred pred) {
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (pred(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// The thresholds searched from quantize(); round_thresholds() keeps them per (format, option).
RoundThresholds search_thresholds(Format f, RoundOptions opt) {
  RoundOptions overflow_as_nan = opt;
  overflow_as_nan.e4m3_overflow_to_nan = true;  // makes saturation visible as NaN
  const float min_normal = static_cast<float>(format_info(f).min_normal);
  RoundThresholds t{};
  t.first_nonzero =
      first_true(1u, kInfBits, [&](std::uint32_t a) { return quantize(from_bits(a), f, opt) != 0.0f; });
  t.first_normal =
      first_true(1u, kInfBits, [&](std::uint32_t a) { return quantize(from_bits(a), f, opt) >= min_normal; });
  t.first_overflow = first_true(1u, kInfBits, [&](std::uint32_t a) {
    return !std::isfinite(quantize(from_bits(a), f, overflow_as_nan));
  });
  return t;
}

}  // namespace

const RoundThresholds& round_thresholds(Format f, RoundOptions opt) {
  static const auto table = [] {
    std::array<std::array<RoundThresholds, 2>, 5> t{};
    for (Format g : all_formats())
      for (int nan_opt = 0; nan_opt < 2; ++nan_opt)
        t[static_cast<std::size_t>(g)][static_cast<std::size_t>(nan_opt)] =
            search_thresholds(g, RoundOptions{nan_opt == 1});
    return t;
  }();
  return table[static_cast<std::size_t>(f)][opt.e4m3_overflow_to_nan ? 1 : 0];
}

namespace {

// The class index: how many thresholds |v| (as bits a) passes.
inline int class_index(std::uint32_t a, const RoundThresholds& th) {
  return (a != 0) + (a >= th.first_nonzero) + (a >= th.first_normal) + (a >= th.first_overflow) +
         (a >= kInfBits);
}

}  // namespace

RoundClass classify_rounding(float v, Format f, RoundOptions opt) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<RoundClass>(class_index(bits & kAbsBits, round_thresholds(f, opt)));
}

const char* round_class_name(RoundClass c) {
  static const char* const names[] = {"zero", "underflow", "subnormal", "normal", "overflow", "nonfinite"};
  return names[static_cast<int>(c)];
}

std::uint32_t edge_threshold_bits(float edge, Format f, RoundOptions opt) {
  GS_CHECK_NUMERIC(edge > 0.0f && std::isfinite(edge),
                   "count_about_edge: the edge must be a positive finite float, got " << edge);
  // Smallest |v| (as bits) whose rounding reaches the edge (an overflow to NaN counts as reaching it,
  // which keeps the predicate monotone); NaN inputs lie above inf's pattern and count in neither bin.
  return first_true(1u, kInfBits,
                    [&](std::uint32_t a) { return !(std::fabs(quantize(from_bits(a), f, opt)) < edge); });
}

EdgeCounts count_about_edge(const float* v, std::size_t n, float edge, Format f, RoundOptions opt) {
  const std::uint32_t t = edge_threshold_bits(edge, f, opt);
  GS_CHECK_NUMERIC(v != nullptr || n == 0, "count_about_edge: null data with n = " << n);
  EdgeCounts c;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, v + i, sizeof b);
    const std::uint32_t a = b & kAbsBits;
    c.below += a < t;
    c.above += a >= t && a <= kInfBits;
  }
  return c;
}

}  // namespace gradscale
