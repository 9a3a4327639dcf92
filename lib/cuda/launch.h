// Launch geometry shared by the kernels of lib/cuda: one block size, and a grid for grid-stride loops
// that is a fixed function of the element count (never of the device), so every reduction adds in the
// same order on every GPU and results reproduce bit for bit.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <algorithm>
#include <cstddef>

namespace gradscale::cuda {

constexpr unsigned kBlock = 256;     // threads per block of every elementwise kernel
constexpr unsigned kMaxGrid = 4096;  // blocks of a grid-stride loop (enough to fill an H100 / H200)

// Blocks for a grid-stride loop over n elements, at least `per_thread` elements per thread when n is
// large; at least 1 block (a kernel may have to write an empty result).
inline unsigned grid_for(std::size_t n, unsigned per_thread = 1, unsigned max_blocks = kMaxGrid) {
  const std::size_t per_block = static_cast<std::size_t>(kBlock) * per_thread;
  const std::size_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, max_blocks));
}

// Jobs sent in batches, one launch each (round_copies, adam_update_many, sgd_update_many): the jobs
// i < count with size_of(i) > 0, in order, at most per_launch to a batch. add(i, slot) puts job i into
// slot `slot` of the batch being filled; launch(jobs, largest) sends a batch of `jobs` jobs whose largest
// has `largest` elements.
template <class SizeOf, class Add, class Launch>
void launch_in_batches(std::size_t count, std::size_t per_launch, SizeOf size_of, Add add, Launch launch) {
  std::size_t in_batch = 0, largest = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t n = size_of(i);
    if (n == 0) continue;
    add(i, in_batch++);
    largest = std::max(largest, n);
    if (in_batch == per_launch) {
      launch(in_batch, largest);
      in_batch = largest = 0;
    }
  }
  if (in_batch > 0) launch(in_batch, largest);
}

}  // namespace gradscale::cuda
