// The CPU execution target of lib/cuda: its device memory, which is host memory that the runtime
// (runtime.cpp) keeps a registry of, so that copies can check their directions and launches their
// pointer arguments, and the executor can compare the bytes two runs of a kernel wrote.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
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

// The plug-in's core over this target (gradscale._core_cpu_target) hands the kernels PyTorch's CPU
// tensors as device memory: with this on, memory outside every allocation counts as device memory
// (as system memory does on a GPU with heterogeneous memory management) for launches and copies, and
// each launch runs once, in one order (the two-order check restores only the registered allocations,
// and would apply an in-place kernel twice to the rest). Off by default: the C++ tests keep every check.
void set_system_memory_is_device(bool on);
bool system_memory_is_device();

// One device for the whole process, as one GPU's queue: a launch, a copy, a fill, a GEMM, an allocation
// and a release hold this lock while they run, so host threads that drive contexts of their own (two
// ranks as two threads, tests/test_cuda_distributed.cpp) never overlap a kernel's two-order check
// (which saves and restores every allocation's bytes).
std::recursive_mutex& device_lock();

// Records a fault for the next cudaGetLastError (and cudaStreamSynchronize) and says on stderr why:
// the status alone ("invalid argument") would not name the copy or the kernel.
void report_fault(cudaError_t e, const std::string& why);

}  // namespace gs_emu
