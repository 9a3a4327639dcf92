// Single passes that answer one question each about a float32 array: its largest magnitude (found_inf
// and the join's max|g|, SPEC §5) and whether, and where, it holds a non-finite value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradscale {

// max |v[i]|, with NaN counted as +inf; 0 for an empty array. One pass that serves both the found_inf
// check (a result of inf means some value was not finite) and the join's max|g| (SPEC §5).
float max_abs(const float* v, std::size_t n);

// True when every v[i] is finite.
bool all_finite(const float* v, std::size_t n);
// The index of the first v[i] that is inf or NaN, or -1 when all are finite (cuda::first_nonfinite is
// the GPU's twin).
std::int64_t first_nonfinite(const float* v, std::size_t n);

}  // namespace gradscale
