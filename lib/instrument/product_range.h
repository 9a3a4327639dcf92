// The range of the partial products of a GEMM (SPEC §6.2, element_wise): over every product
// g[n,k]·W[k,m] whose two factors are non-zero, the smallest and the largest |product|. Streamed over
// the factors — never materialising the N·K·M products — with constant extra memory, for the dense
// upstream GEMM of Linear and for Conv2d through its im2col geometry (a product exists only where the
// kernel tap lands inside the input, so padding taps are excluded exactly).
#pragma once

#include <cstdint>

namespace gradscale {

struct ProductRange {
  double min_abs = 0;  // smallest non-zero |g·w| (exact: products of two floats are exact in double)
  double max_abs = 0;  // largest |g·w|
  bool empty() const { return max_abs == 0; }  // no product with both factors non-zero
};

// Linear: upstream = g · W with g [n, k] (row-major) and W [k, m]; products g[i, j]·W[j, c].
ProductRange dense_product_range(const float* g, std::int64_t n, std::int64_t k, const float* w,
                                 std::int64_t m);

// Conv2d's upstream gradient gx[c, ih, iw] = Σ_{o, ki, kj} W[o, c, ki, kj] · g[o, oh, ow] over the taps
// with ih = oh·stride − pad + ki and iw = ow·stride − pad + kj inside the input.
struct ConvGeometry {
  std::int64_t n = 0, in_channels = 0, out_channels = 0, kernel = 0, stride = 1, pad = 0;
  std::int64_t h = 0, w = 0, ho = 0, wo = 0;  // input and output plane sizes
};
// g [n, out_channels, ho, wo], W [out_channels, in_channels, kernel, kernel].
ProductRange conv_product_range(const float* g, const float* w, const ConvGeometry& geo);

}  // namespace gradscale
