// Helpers of the lib/cuda tests (test_cuda*.cpp, built only with CUDA): the visible skip when there is
// no GPU, host↔device copies, bit views of floats and a mismatch report that names the first offenders.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "lib/cuda/context.h"
#include "lib/cuda/device_buffer.h"
#include "tests/skip.h"

namespace gradscale::test {

// First statement of every test case that needs a GPU: without one the case is reported as Skipped
// (exit code 4) with the runtime's reason, never as passed.
inline void require_cuda_device() {
  if (cuda::device_count() == 0) skip_test("no CUDA device: " + cuda::no_device_reason());
}

// Whether this test binary runs lib/cuda on its CPU execution target (tests/cuda_on_cpu) rather than as
// nvcc built it. The test_cuda*.cpp objects are compiled once and linked into both binaries; each binary
// links one definition of this (tests/cuda_target_gpu.cpp, tests/cuda_on_cpu/cuda_target_cpu.cpp).
bool on_cpu_execution_target() noexcept;

// Kernel launches so far in this process, where the execution target counts them (the CPU target), or
// -1 (a GPU: the runtime does not count them). For a case that asserts how many kernels an operation takes.
long long kernel_launches() noexcept;

// First statement of a case that counts kernel launches: a device, and an execution target that counts
// them (the CPU target), else the case is reported as Skipped.
inline void require_launch_counts() {
  require_cuda_device();
  if (kernel_launches() < 0) skip_test("kernel launches are counted on the CPU execution target only");
}

// First statement of a case that only a real GPU can answer (speed, the real cuBLAS, a program other
// than this test binary): on the CPU execution target of lib/cuda the case is reported as Skipped with
// `why`.
inline void require_gpu_hardware(const std::string& why) {
  if (on_cpu_execution_target())
    skip_test("lib/cuda runs on the CPU execution target here, which cannot answer this: " + why);
}

// The size a case uses: `on_gpu` on a GPU, `on_cpu_target` on the CPU execution target, where each CUDA
// thread is a fiber and every barrier or shuffle it crosses costs tens of nanoseconds. Only for a case
// whose point holds at the smaller size (docs/gpu.md, "The CPU execution target").
template <class T>
T gpu_or_cpu_target(T on_gpu, T on_cpu_target) {
  return on_cpu_execution_target() ? on_cpu_target : on_gpu;
}

inline std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
inline float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
inline std::string hex(std::uint32_t b) {
  std::ostringstream os;
  os << "0x" << std::hex << b;
  return os.str();
}

template <class T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& v, const cuda::CudaContext& ctx) {
  return cuda::DeviceBuffer<T>::from_host(v, ctx.stream());
}
template <class T>
std::vector<T> to_host(const cuda::DeviceBuffer<T>& b, const cuda::CudaContext& ctx) {
  return b.to_host(ctx.stream());
}
// A device buffer of n elements with every byte 0xFF: for floats the NaN 0xFFFFFFFF, a sentinel that
// shows an element the kernel never wrote.
template <class T>
cuda::DeviceBuffer<T> sentinel_buffer(std::size_t n, const cuda::CudaContext& ctx) {
  cuda::DeviceBuffer<T> b(n);
  b.fill_bytes(0xFF, ctx.stream());
  return b;
}

// Compares two float arrays bit for bit; returns "" or a report of the count and the first few
// mismatches (index, input, got, expected as bit patterns).
inline std::string bit_mismatches(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::vector<float>* inputs = nullptr) {
  if (got.size() != want.size()) return "sizes differ";
  std::size_t bad = 0;
  std::ostringstream os;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) == bits_of(want[i])) continue;
    if (++bad <= 8) {
      os << "  [" << i << "]";
      if (inputs) os << " in " << hex(bits_of((*inputs)[i])) << " (" << (*inputs)[i] << ")";
      os << " got " << hex(bits_of(got[i])) << " (" << got[i] << ") want " << hex(bits_of(want[i])) << " ("
         << want[i] << ")\n";
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " differ:\n" + os.str();
}

}  // namespace gradscale::test
