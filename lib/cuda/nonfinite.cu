// First non-finite index per tensor (see nonfinite.h): grid (blocks, tensors), the tensor table passed
// by value; each thread stops at its first hit (its smallest index: a thread's indices increase) and
// the block's smallest goes to an atomic minimum, which gives the same result in any order.
#include "lib/cuda/nonfinite.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

constexpr int kJobsPerLaunch = 32;

struct NonFiniteTable {
  const float* data[kJobsPerLaunch];
  unsigned long long n[kJobsPerLaunch];
};

__global__ void first_nonfinite_kernel(NonFiniteTable table, unsigned long long* first) {
  const int job = static_cast<int>(blockIdx.y);
  const float* x = table.data[job];
  const std::size_t n = table.n[job];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if ((__float_as_uint(x[i]) & 0x7F800000u) == 0x7F800000u) {  // exponent all ones: inf or NaN
      atomicMin(first + job, static_cast<unsigned long long>(i));
      return;
    }
  }
}

}  // namespace

void first_nonfinite(const NonFiniteJob* jobs, std::size_t count, unsigned long long* first, cudaStream_t stream) {
  if (count == 0) return;
  GS_CHECK(jobs != nullptr && first != nullptr, "cuda::first_nonfinite got a null jobs array or result");
  for (std::size_t i = 0; i < count; ++i)
    GS_CHECK(jobs[i].data != nullptr || jobs[i].n == 0,
             "cuda::first_nonfinite: tensor " << i << " of " << jobs[i].n << " elements is null");
  GS_CUDA_CHECK(cudaMemsetAsync(first, 0xFF, count * sizeof(unsigned long long), stream));  // kAllFinite
  for (std::size_t start = 0; start < count; start += kJobsPerLaunch) {
    NonFiniteTable table{};
    const int m = static_cast<int>(std::min<std::size_t>(kJobsPerLaunch, count - start));
    std::size_t largest = 0;
    for (int j = 0; j < m; ++j) {
      table.data[j] = jobs[start + static_cast<std::size_t>(j)].data;
      table.n[j] = jobs[start + static_cast<std::size_t>(j)].n;
      largest = std::max(largest, jobs[start + static_cast<std::size_t>(j)].n);
    }
    first_nonfinite_kernel<<<dim3(grid_for(largest, 4, 1024), static_cast<unsigned>(m)), kBlock, 0, stream>>>(
        table, first + start);
    GS_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace gradscale::cuda
