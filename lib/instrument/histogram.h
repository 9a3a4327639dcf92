// Underflow instrumentation (SPEC §3): one pass over a float32 tensor for a format F gives the counts
// of what rounding to F does (zero, underflow, subnormal, normal, overflow, nonfinite), the binade
// histogram of |v| and double-precision moments. This is the single implementation of "how much
// underflowed": every scaler, trace and experiment reads its statistics from here (its GPU twin,
// cuda::tensor_stats in lib/cuda/stats.h, cuts at the same round_thresholds and gives identical counts
// and bins).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <nlohmann/json_fwd.hpp>

#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"

namespace gradscale {

// Binade bins: bin b counts non-zero finite |v| with floor(log2|v|) == kBinadeMin + b, clamped at the
// ends. float32 spans floor(log2|v|) in [-149, 127], so no clamping happens for float inputs.
constexpr int kBinadeMin = -150;
constexpr int kBinadeMax = 128;
constexpr int kBinadeCount = kBinadeMax - kBinadeMin + 1;

struct TensorStats {
  // Counts by what round(v, F) does; they sum to `elements`.
  std::uint64_t zero = 0;       // v == 0
  std::uint64_t underflow = 0;  // v != 0, round(v, F) == 0
  std::uint64_t subnormal = 0;  // round(v, F) is a non-zero subnormal of F
  std::uint64_t normal = 0;     // round(v, F) is a normal number of F
  std::uint64_t overflow = 0;   // finite v, round(v, F) is ±inf, NaN or saturated
  std::uint64_t nonfinite = 0;  // v is NaN or ±inf
  std::uint64_t elements = 0;

  std::array<std::uint64_t, kBinadeCount> binades{};  // non-zero finite |v| per floor(log2|v|)

  // Moments over the finite values (count = elements - nonfinite), in double.
  std::uint64_t count = 0;
  double sum = 0, sum_squares = 0;
  double min = 0, max = 0, max_abs = 0;  // 0 when count == 0
  double min_nonzero_abs = 0;            // smallest non-zero finite |v| (abs_range); 0 when none

  double mean() const;
  double variance() const;        // population variance (zeros included)
  double underflow_rate() const;  // underflow / (non-zero finite), 0 when none
  std::uint64_t nonzero_finite() const { return elements - zero - nonfinite; }
  bool has_nonfinite() const { return nonfinite != 0; }
  std::uint64_t binade(int e) const;  // count at floor(log2|v|) == e (clamped like the bins)

  // Adds another tensor's statistics (counts, bins and sums add; extremes combine).
  void merge(const TensorStats& other);
};

// Thresholds of round(v, F) on |v|, derived from quantize() itself (one rounding rule), searched once
// per (format, option) and kept: the CPU pass and lib/cuda's statistics read the same table.
// Every value is a float32 bit pattern of a non-negative float; classes are cut by a_bits >= t.
struct RoundThresholds {
  std::uint32_t first_nonzero;   // smallest |v| whose rounding is not 0
  std::uint32_t first_normal;    // smallest |v| whose rounding is a normal number
  std::uint32_t first_overflow;  // smallest |v| whose rounding overflows (0x7F800000 when none)
};
const RoundThresholds& round_thresholds(Format f, RoundOptions opt = {});

// What rounding one value to F does: the class index of TensorStats' counts, for single values.
enum class RoundClass : std::uint8_t { zero, underflow, subnormal, normal, overflow, nonfinite };
RoundClass classify_rounding(float v, Format f, RoundOptions opt = {});
const char* round_class_name(RoundClass c);

// One pass over v[0..n) for format F. Throws nothing; NaN/inf are counted, never propagated.
// Tensors of 2^17 elements or more are split over the OpenMP threads (counts and bins are exact for any
// split; the double sums are added in thread order, so they are reproducible for a thread count).
TensorStats tensor_stats(const float* v, std::size_t n, Format f, RoundOptions opt = {});

// The moments only (count, sum, sum_squares, min, max, max_abs, min_nonzero_abs, elements, nonfinite):
// what the moment-based controllers read (approx_range, abs_range), several times cheaper than the
// full pass. The class counts and bins stay 0 (zero = underflow = ... = 0), so never read them from here.
TensorStats tensor_moments(const float* v, std::size_t n);

// max |v[i]|, with NaN counted as +inf; 0 for an empty array. One pass that serves both the found_inf
// check (a result of inf means some value was not finite) and the join's max|g| (SPEC §5).
float max_abs(const float* v, std::size_t n);

// Two-bin counts for statistics-driven loss scaling (SPEC §7, popart_als): how many values lie below an
// edge and how many at or above it, as they will be after rounding to F — |round(v, F)| against the edge,
// which (rounding being monotone) is |v| against the smallest float that rounds to at least the edge,
// found once by binary search over quantize() like every other threshold here; F = fp32 counts the
// values as they are. Zeros count below, ±inf above, NaN in neither (a NaN sets found_inf anyway).
// `edge` must be a positive finite float (else NumericError); `v` may be null when n == 0.
struct EdgeCounts {
  std::uint64_t below = 0;  // |v| < edge
  std::uint64_t above = 0;  // |v| >= edge
  EdgeCounts& operator+=(const EdgeCounts& other) {
    below += other.below;
    above += other.above;
    return *this;
  }
};
EdgeCounts count_about_edge(const float* v, std::size_t n, float edge, Format f = Format::fp32,
                            RoundOptions opt = {});
// The cut count_about_edge uses: the bits of the smallest non-negative float whose rounding to F reaches
// `edge` (an overflow to NaN counts as reaching it). A value v counts above when t <= (bits(v) & 0x7FFFFFFF)
// <= bits(inf), below when it is less (the twin on the GPU, cuda::count_about_edge, cuts there too).
// NumericError unless edge is a positive finite float.
std::uint32_t edge_threshold_bits(float edge, Format f = Format::fp32, RoundOptions opt = {});

// True when every v[i] is finite.
bool all_finite(const float* v, std::size_t n);
// The index of the first v[i] that is inf or NaN, or -1 when all are finite (cuda::first_nonfinite is
// the GPU's twin).
std::int64_t first_nonfinite(const float* v, std::size_t n);

// JSON with the counts and moments, and the non-empty binades as {"e": count} when with_binades.
nlohmann::json stats_to_json(const TensorStats& s, bool with_binades = false);

}  // namespace gradscale
