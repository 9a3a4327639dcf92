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
template <bool UnitStride>
__device__ inline float col2im_sum(const float* rows, int k, int stride, int pad, int w, int ho, int wo,
                                   std::int64_t row, int t) {
  if (UnitStride) stride = 1;
  const int ih = t / w, iw = t - ih * w;
  const int th = ih + pad, tw = iw + pad;  // = oh·stride + ki, ow·stride + kj
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
