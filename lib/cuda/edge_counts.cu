// Two-bin edge counts (see edge_counts.h): a grid-stride count per thread, a block sum, one atomic add
// per block and bin (integer sums: the same result in any order).
#include "lib/cuda/edge_counts.h"

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"
#include "lib/cuda/reduce.cuh"

namespace gradscale::cuda {
namespace {

constexpr std::uint32_t kAbs = 0x7FFFFFFFu, kInfBits = 0x7F800000u;

__global__ void edge_counts_kernel(const float* v, std::size_t n, std::uint32_t t, DeviceEdgeCounts* out) {
  unsigned long long below = 0, above = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t a = __float_as_uint(v[i]) & kAbs;
    below += a < t;
    above += a >= t && a <= kInfBits;
  }
  below = device::block_reduce(below, device::Sum{});
  above = device::block_reduce(above, device::Sum{});
  if (threadIdx.x == 0) {
    if (below != 0) atomicAdd(&out->below, below);
    if (above != 0) atomicAdd(&out->above, above);
  }
}

}  // namespace

void count_about_edge(const float* v, std::size_t n, std::uint32_t threshold_bits, DeviceEdgeCounts* out,
                      cudaStream_t stream) {
  GS_CHECK(out != nullptr, "cuda::count_about_edge: null result record");
  if (n == 0) return;
  GS_CHECK(v != nullptr, "cuda::count_about_edge: null data with n = " << n);
  edge_counts_kernel<<<grid_for(n, 8), kBlock, 0, stream>>>(v, n, threshold_bits, out);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
