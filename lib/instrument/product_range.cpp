// Partial-product ranges of the upstream GEMMs (see product_range.h). The smallest non-zero |g·w| over
// a set of pairs is (smallest non-zero |g|)·(smallest non-zero |w|) over the pairs that share the
// reduction index, and likewise for the largest, so one pass per reduction index over each factor gives
// exactly what enumerating every product would.
#include "lib/instrument/product_range.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/error.h"

namespace gradscale {
namespace {

// Smallest non-zero and largest |v| of a set of floats (non-finite values are ignored: a gradient with
// them makes the step overflow anyway).
struct Extremes {
  float lo = std::numeric_limits<float>::infinity(), hi = 0;
  void add(float v) {
    const float a = std::fabs(v);
    if (a == 0.0f || !std::isfinite(a)) return;
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  bool empty() const { return hi == 0.0f; }
};

void combine(ProductRange& r, const Extremes& a, const Extremes& b) {
  if (a.empty() || b.empty()) return;
  const double lo = static_cast<double>(a.lo) * b.lo, hi = static_cast<double>(a.hi) * b.hi;
  r.min_abs = r.max_abs == 0 ? lo : std::min(r.min_abs, lo);
  r.max_abs = std::max(r.max_abs, hi);
}

// [lo, hi) of output positions o with o·stride − pad + offset in [0, size).
void valid_range(std::int64_t size, std::int64_t out, std::int64_t stride, std::int64_t pad, std::int64_t offset,
                 std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t first = pad - offset, last = size - 1 + pad - offset;
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, out);
  hi = std::max(lo, std::min(hi, out));
}

}  // namespace

ProductRange dense_product_range(const float* g, std::int64_t n, std::int64_t k, const float* w, std::int64_t m) {
  GS_CHECK(n >= 0 && k >= 0 && m >= 0, "dense_product_range: negative shape");
  ProductRange r;
  for (std::int64_t j = 0; j < k; ++j) {
    Extremes gj, wj;
    for (std::int64_t i = 0; i < n; ++i) gj.add(g[i * k + j]);
    for (std::int64_t c = 0; c < m; ++c) wj.add(w[j * m + c]);
    combine(r, gj, wj);
  }
  return r;
}

ProductRange conv_product_range(const float* g, const float* w, const ConvGeometry& geo) {
  const std::int64_t k = geo.kernel, plane = geo.ho * geo.wo;
  GS_CHECK(k > 0 && geo.stride > 0 && geo.pad >= 0, "conv_product_range: bad geometry");
  ProductRange r;
  for (std::int64_t o = 0; o < geo.out_channels; ++o) {
    for (std::int64_t ki = 0; ki < k; ++ki) {
      std::int64_t oh_lo = 0, oh_hi = 0;
      valid_range(geo.h, geo.ho, geo.stride, geo.pad, ki, oh_lo, oh_hi);
      for (std::int64_t kj = 0; kj < k; ++kj) {
        std::int64_t ow_lo = 0, ow_hi = 0;
        valid_range(geo.w, geo.wo, geo.stride, geo.pad, kj, ow_lo, ow_hi);
        // The gradients this tap multiplies: g[:, o, oh_lo:oh_hi, ow_lo:ow_hi]; the weights: W[o, :, ki, kj].
        Extremes gt, wt;
        for (std::int64_t i = 0; i < geo.n; ++i) {
          const float* gi = g + (i * geo.out_channels + o) * plane;
          for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh)
            for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) gt.add(gi[oh * geo.wo + ow]);
        }
        for (std::int64_t c = 0; c < geo.in_channels; ++c) wt.add(w[((o * geo.in_channels + c) * k + ki) * k + kj]);
        combine(r, gt, wt);
      }
    }
  }
  return r;
}

}  // namespace gradscale
