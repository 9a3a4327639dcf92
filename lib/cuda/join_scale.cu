// The backward join's target scale and rescaled sum on the device (see join_scale.h).
#include "lib/cuda/join_scale.h"

#include <math_constants.h>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"
#include "lib/model/join_target.h"

namespace gradscale::cuda {
namespace {

__global__ void join_target_kernel(JoinParts parts, DeviceScale* out) {
  double max_abs[kMaxJoinParts], scales[kMaxJoinParts];
  for (int i = 0; i < parts.count; ++i) {
    const DeviceStats* s = parts.stats[i];
    // max|g| as lib/instrument's max_abs: infinite when something is not finite.
    max_abs[i] = s->nonfinite > 0 ? CUDART_INF : s->max_abs;
    scales[i] = parts.scales[i]->scale;
  }
  *out = DeviceScale{gradscale::join_target(max_abs, scales, parts.count, parts.limit), 1, 1};
}

__global__ void scale_add_rescaled_kernel(const float* src, const DeviceScale* target, const DeviceScale* part,
                                          float* dst, std::size_t n) {
  const auto factor = static_cast<float>(target->scale / part->scale);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = dst[i] + src[i] * factor;
}

}  // namespace

void choose_join_scale(const JoinParts& parts, DeviceScale* out, cudaStream_t stream) {
  GS_CHECK(parts.count >= 1 && parts.count <= kMaxJoinParts,
           "cuda::choose_join_scale: " << parts.count << " parts (1 to " << kMaxJoinParts << ")");
  GS_CHECK(out != nullptr, "cuda::choose_join_scale got a null target entry");
  for (int i = 0; i < parts.count; ++i)
    GS_CHECK(parts.stats[i] != nullptr && parts.scales[i] != nullptr,
             "cuda::choose_join_scale: part " << i << " has a null statistic or scale");
  join_target_kernel<<<1, 1, 0, stream>>>(parts, out);
  GS_CUDA_CHECK_LAUNCH();
}

void scale_add_rescaled(const float* src, const DeviceScale* target, const DeviceScale* part, float* dst,
                        std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(src != nullptr && dst != nullptr && target != nullptr && part != nullptr,
           "cuda::scale_add_rescaled of " << n << " elements got a null pointer");
  scale_add_rescaled_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(src, target, part, dst, n);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
