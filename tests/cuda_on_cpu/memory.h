// The CPU execution target of lib/cuda: its device memory, which is host memory that the runtime
// (runtime.cpp) keeps a registry of, so that copies can check their directions and launches their
// pointer arguments, and the executor can compare the bytes two runs of a kernel wrote.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace gs_emu {

enum class MemoryKind { device, pinned_host };

struct Allocation {
  unsigned char* base;
  std::size_t size;
  MemoryKind kind;
};

// The allocation that holds [p, p + bytes) (bytes 0: p may also be its one-past-the-end), or nullptr.
const Allocation* find_allocation(const void* p, std::size_t bytes);
// Every live allocation, device and page-locked host, in address order.
std::vector<Allocation> allocations();

// Records a fault for the next cudaGetLastError (and cudaStreamSynchronize) and says on stderr why:
// the status alone ("invalid argument") would not name the copy or the kernel.
void report_fault(cudaError_t e, const std::string& why);

}  // namespace gs_emu
