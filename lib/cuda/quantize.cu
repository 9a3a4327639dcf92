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
  r.mantissa_bits = fi.mantissa_bits;
  r.min_exponent = fi.min_exponent();
  r.max_finite = static_cast<float>(fi.max_finite);
  r.nan_drop_mask = (1u << (23 - fi.mantissa_bits)) - 1u;
  r.single_nan = !fi.has_infinity;
  r.overflow = fi.overflow;
  if (f == Format::fp8_e4m3 && opt.e4m3_overflow_to_nan) r.overflow = OverflowRule::nan;
  return r;
}

namespace {

__global__ void quantize_kernel(const float* in, float* out, std::size_t n, float multiplier,
                                DeviceRounding rounding) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
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
