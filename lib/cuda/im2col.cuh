// col2im's sum for one input element, as device code: col2im_kernel (im2col.cu) and the statistics
// kernel's column source (stats.cu, col2im_measured) both call it, so the two give the same bits.
#pragma once

#if !defined(__CUDACC__)
#error "lib/cuda/im2col.cuh holds device code: include it from .cu files only"
#endif

#include <cstdint>

#include "lib/cuda/im2col.h"

namespace gradscale::cuda::device {

// Input element (ih, iw) = position t of its plane receives the entry (ki, kj, oh, ow) where
// oh·stride + ki = ih + pad (and the same across): for each ki ≡ ih + pad (mod stride), ascending, oh
// falls by one. `rows`: the plane's first column row (sample b, channel c). UnitStride: every ki.
// A 3×3 kernel at stride 1 (every convolution of the built-in CNNs but the projections): its nine
// taps loaded, predicated, then added in the same (ki, kj) order, the taps outside the output skipped
// — the general loop's sum, bit for bit, with the loads no longer held apart by its bounds checks
// (docs/gpu.md, "Registers and occupancy").
__device__ __forceinline__ float col2im_sum_3x3(const float* rows, int ho, int wo, std::int64_t row, int th,
                                                int tw) {
  float v[9];
  bool in[9];
  for (int ki = 0; ki < 3; ++ki) {
    for (int kj = 0; kj < 3; ++kj) {
      const int oh = th - ki, ow = tw - kj, tap = 3 * ki + kj;
      in[tap] = oh >= 0 && oh < ho && ow >= 0 && ow < wo;
      v[tap] = in[tap] ? rows[static_cast<std::int64_t>(tap) * row + static_cast<std::int64_t>(oh) * wo + ow] : 0.0f;
    }
  }
  float sum = 0.0f;
  for (int tap = 0; tap < 9; ++tap)
    if (in[tap]) sum += v[tap];
  return sum;
}

template <bool UnitStride>
__device__ inline float col2im_sum(const float* rows, int k, int stride, int pad, int w, int ho, int wo,
                                   std::int64_t row, int t) {
  if (UnitStride) stride = 1;
  const int ih = t / w, iw = t - ih * w;
  const int th = ih + pad, tw = iw + pad;  // = oh·stride + ki, ow·stride + kj
  if (UnitStride && k == 3) return col2im_sum_3x3(rows, ho, wo, row, th, tw);
  const int ki0 = UnitStride ? 0 : th % stride, kj0 = UnitStride ? 0 : tw % stride;
  const int oh0 = UnitStride ? th : th / stride, ow0 = UnitStride ? tw : tw / stride;
  float sum = 0.0f;
  for (int ki = ki0, oh = oh0; ki < k && oh >= 0; ki += stride, --oh) {
    if (oh >= ho) continue;
    const float* r = rows + static_cast<std::int64_t>(ki * k) * row + static_cast<std::int64_t>(oh) * wo;
    for (int kj = kj0, ow = ow0; kj < k && ow >= 0; kj += stride, --ow)
      if (ow < wo) sum += r[kj * row + ow];
  }
  return sum;
}

}  // namespace gradscale::cuda::device
