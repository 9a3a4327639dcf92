// The CPU execution target of lib/cuda: the executor that runs a kernel launch on the host (see
// kernel_shim.h). The blocks of a launch run one after the other; within a block every CUDA thread is
// a fiber that runs until it reaches a barrier or a warp operation, and the executor resumes the
// others until all have arrived, so barriers and shuffles have CUDA's semantics. A launch runs twice
// over the same device memory, threads and blocks in forward order and then reversed between the
// barriers, and fails (cudaErrorLaunchFailure, with a report on stderr) when the two runs write different
// bytes: a race or a missing barrier (every launch with GS_CUDA_ON_CPU_ORDERS=all; otherwise each launch
// site's first few and one in 64 after them).
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>

namespace gs_emu {

// What a launch names (grid, block, stream) and where it is in lib/cuda, for the executor's reports.
struct LaunchConfig {
  dim3 grid, block;
  std::size_t shared = 0;
  cudaStream_t stream = nullptr;
  const char* file = "";
  int line = 0;
  // The kernel's pointer arguments, which must point into device (or page-locked host) memory.
  static constexpr int kMaxPointers = 32;
  const void* pointers[kMaxPointers] = {};
  int pointer_index[kMaxPointers] = {};
  int pointer_count = 0;
};

// The built-in variables of the CUDA thread now running.
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
ThreadContext& current();

enum class BarrierOp { plain, any, all, count };
// __syncthreads and its reducing forms: returns the reduction of `value` over the block (0 for plain).
int block_barrier(BarrierOp op, int value);

enum class ShuffleOp { index, up, down, bfly, ballot };
// A warp operation of the lanes in `mask` (each must call it): the shuffled bits, or the ballot.
std::uint64_t warp_shuffle(ShuffleOp op, unsigned mask, std::uint64_t value, int arg, int width);
// The lanes of the running thread's warp that exist and have not exited.
unsigned live_lanes();

void note_pointer(LaunchConfig& c, int index, const void* p);
// Runs body(data) as every thread of the launch c, twice (see above). Reports a fault through the
// runtime's last error (cudaGetLastError).
void run_kernel(const LaunchConfig& c, void (*body)(void*), void* data);
// Kernel launches run (or refused) so far in this process: what a test counts to see how many kernels
// an operation takes.
unsigned long long launches() noexcept;

}  // namespace gs_emu
