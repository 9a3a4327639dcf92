// Local scales decided on the device (see local_scale.h).
#include "lib/cuda/local_scale.h"

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/decide.cuh"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

__global__ void set_scale_kernel(DeviceScale* entry, double value) { *entry = DeviceScale{value, 1, 1}; }

__global__ void decide_kernel(ScaleRule rule, const DeviceStats* grad, const DeviceStats* weight,
                              const DeviceStats* upstream, const DeviceScale* in, DeviceScale* out) {
  device::decide_local(rule, grad, weight, upstream, in, out);
}

__global__ void apply_kernel(const float* src, float* d, std::size_t n, const DeviceScale* entry) {
  const float s = static_cast<float>(entry->local);
  if (s == 1.0f && src == d) return;  // as cuda::quantize's multiplier: 1 leaves every value as it is
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = s == 1.0f ? src[i] : src[i] * s;
}

__global__ void divide_kernel(float* d, std::size_t n, const DeviceScale* entry) {
  // scale_in_float_range (lib/scaler/scale_range.h) on the double, as the host path checks r·S.
  const double v = entry->scale;
  if (!(v >= 1.1754943508222875e-38 && v <= 3.4028234663852886e+38)) return;
  const float s = static_cast<float>(v);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = d[i] / s;
}

}  // namespace

void divide_by_scale(float* d, std::size_t n, const DeviceScale* entry, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(d != nullptr && entry != nullptr, "cuda::divide_by_scale of " << n << " elements got a null pointer");
  divide_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(d, n, entry);
  GS_CUDA_CHECK_LAUNCH();
}

void set_scale(DeviceScale* entry, double value, cudaStream_t stream) {
  GS_CHECK(entry != nullptr, "cuda::set_scale got a null entry");
  set_scale_kernel<<<1, 1, 0, stream>>>(entry, value);
  GS_CUDA_CHECK_LAUNCH();
}

void decide_local_scale(const ScaleRule& rule, const DeviceStats* grad, const DeviceStats* weight,
                        const DeviceStats* upstream, const DeviceScale* in, DeviceScale* out, cudaStream_t stream) {
  GS_CHECK(in != nullptr && out != nullptr, "cuda::decide_local_scale got a null scale entry");
  GS_CHECK(!rule_reads_moments(rule.formula) || (grad != nullptr && weight != nullptr),
           "cuda::decide_local_scale: formula " << rule.formula << " reads the moments of g and W");
  GS_CHECK(!rule_reads_upstream(rule.formula) || upstream != nullptr,
           "cuda::decide_local_scale: formula " << rule.formula << " reads the upstream statistics");
  decide_kernel<<<1, 1, 0, stream>>>(rule, grad, weight, upstream, in, out);
  GS_CUDA_CHECK_LAUNCH();
}

void apply_local_scale(const float* src, float* d, std::size_t n, const DeviceScale* entry,
                       cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(src != nullptr && d != nullptr && entry != nullptr,
           "cuda::apply_local_scale of " << n << " elements got a null pointer");
  apply_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(src, d, n, entry);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
