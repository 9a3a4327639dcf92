// Two-bin gradient histogram for statistics-driven loss scaling (SPEC §7, popart_als): how many values
// lie below an edge and how many at or above it. The trainer runs it over every weight-layer gradient
// (stored values in F, at the loss scale) against Scaler::gradient_edge() and sums the counts into
// StepStatistics::grad_below_edge / grad_above_edge.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradscale {

struct EdgeCounts {
  std::uint64_t below = 0;  // |v| < edge
  std::uint64_t above = 0;  // |v| >= edge
  EdgeCounts& operator+=(const EdgeCounts& other) {
    below += other.below;
    above += other.above;
    return *this;
  }
};

// Counts v[0..n) the way PopART's histogram op counts a gradient tensor (absolute values, one level):
// every element is sorted by |v| < edge or |v| >= edge. Zeros count below (|0| < edge), ±inf count
// above; NaN compares false both ways and counts in neither (a NaN also sets found_inf, so that step is
// skipped). `edge` must be a positive finite float (else NumericError); `v` may be null when n == 0.
EdgeCounts count_about_edge(const float* v, std::size_t n, float edge);

}  // namespace gradscale
