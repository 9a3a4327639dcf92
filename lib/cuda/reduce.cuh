// Block-wide reductions for the kernels of lib/cuda (device code only). The order of combination is
// fixed by the thread index (a shuffle tree within each warp, then the warps in order), so a reduction
// of doubles gives the same bits on every run.
#pragma once

#if !defined(__CUDACC__)
#error "lib/cuda/reduce.cuh holds device code: include it from .cu files only"
#endif

namespace gradscale::cuda::device {

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MinFloat {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};
struct MaxFloat {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinUnsigned {
  __device__ unsigned operator()(unsigned a, unsigned b) const { return min(a, b); }
};
struct MaxUnsigned {
  __device__ unsigned operator()(unsigned a, unsigned b) const { return max(a, b); }
};

// Combines v over the whole block with `op` and returns the result to every thread. Every thread of
// the block must call it (it synchronises); blockDim.x must be a multiple of 32 and at most 1024.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T partial[32];
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xFFFFFFFFu, v, offset));
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T r = partial[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) r = op(r, partial[w]);
    partial[0] = r;
  }
  __syncthreads();
  return partial[0];
}

}  // namespace gradscale::cuda::device
