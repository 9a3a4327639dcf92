// quantize() on the GPU (see quantize.h): one grid-stride kernel over the device rounding rule.
#include "lib/cuda/quantize.h"

#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"
#include "lib/cuda/round.cuh"

namespace gradscale::cuda {

DeviceRounding device_rounding(Format f, RoundOptions opt) {
  const FormatInfo& fi = format_info(f);
  DeviceRounding r;
  r.identity = f == Format::fp32;
  if (!r.identity) r.magnitude = float32::fast_rounding(fi.mantissa_bits, fi.min_exponent());
  r.max_finite = static_cast<float>(fi.max_finite);
  r.nan_drop_mask = (1u << (23 - fi.mantissa_bits)) - 1u;
  r.single_nan = !fi.has_infinity;
  r.overflow = fi.overflow;
  if (f == Format::fp8_e4m3 && opt.e4m3_overflow_to_nan) r.overflow = OverflowRule::nan;
  return r;
}

namespace {

constexpr unsigned kUnroll = 4;  // loads a thread has in flight: one per resident thread leaves the memory idle

// A grid-stride loop that loads kUnroll of its elements before it writes the first (each element is read
// and written by its own thread only, so `in` may be `out`).
__global__ void quantize_kernel(const float* in, float* out, std::size_t n, float multiplier,
                                DeviceRounding rounding) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    float x[kUnroll];
    for (unsigned k = 0; k < kUnroll; ++k) x[k] = in[i + k * stride];
    for (unsigned k = 0; k < kUnroll; ++k)
      out[i + k * stride] = device::round_to_format(multiplier == 1.0f ? x[k] : x[k] * multiplier, rounding);
  }
  for (; i < n; i += stride) {
    const float x = multiplier == 1.0f ? in[i] : in[i] * multiplier;
    out[i] = device::round_to_format(x, rounding);
  }
}

void launch_quantize(const float* in, float* out, std::size_t n, float multiplier, const DeviceRounding& r,
                     cudaStream_t stream) {
  quantize_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(in, out, n, multiplier, r);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize(const float* in, float* out, std::size_t n, Format f, RoundOptions opt, float multiplier,
              cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(in != nullptr && out != nullptr, "cuda::quantize of " << n << " elements got a null pointer");
  launch_quantize(in, out, n, multiplier, device_rounding(f, opt), stream);
}

}  // namespace gradscale::cuda
