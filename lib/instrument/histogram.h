// Underflow instrumentation (SPEC §3): one pass over a float32 tensor for a format F gives the counts
// of what rounding to F does (zero, underflow, subnormal, normal, overflow, nonfinite), the binade
// histogram of |v| and double-precision moments. This is the single implementation of "how much
// underflowed": every scaler, trace and experiment reads its statistics from here (its GPU twin,
// cuda::tensor_stats in lib/cuda/stats.h, cuts at the same round_thresholds and gives identical counts
// and bins). Where rounding cuts |v| is round_thresholds.h; the found_inf scans are finite_scan.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <nlohmann/json_fwd.hpp>

#include "lib/instrument/finite_scan.h"
#include "lib/instrument/round_thresholds.h"
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

// One pass over v[0..n) for format F. Throws nothing; NaN/inf are counted, never propagated.
// Tensors of 2^17 elements or more are split over the OpenMP threads (counts and bins are exact for any
// split; the double sums are added in thread order, so they are reproducible for a thread count).
TensorStats tensor_stats(const float* v, std::size_t n, Format f, RoundOptions opt = {});

// The moments only (count, sum, sum_squares, min, max, max_abs, min_nonzero_abs, elements, nonfinite):
// what the moment-based controllers read (approx_range, abs_range), several times cheaper than the
// full pass. The class counts and bins stay 0 (zero = underflow = ... = 0), so never read them from here.
TensorStats tensor_moments(const float* v, std::size_t n);

// JSON with the counts and moments, and the non-empty binades as {"e": count} when with_binades.
nlohmann::json stats_to_json(const TensorStats& s, bool with_binades = false);

}  // namespace gradscale
