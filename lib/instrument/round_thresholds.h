// Where rounding to a format F cuts |v| (SPEC §3): the thresholds of round(v, F) between zero,
// underflow, subnormal, normal and overflow, searched over quantize() itself so that instrumentation
// cannot disagree with rounding; what rounding does to one value; and the two-bin counts about an edge
// of popart_als, cut the same way. tensor_stats (histogram.h) and lib/cuda's statistics read these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"

namespace gradscale {

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

}  // namespace gradscale
