// The CPU execution target of lib/cuda: the part of the CUDA runtime API that lib/cuda calls, over host
// memory. One emulated device; every stream runs its work at once, in the order it is queued (a copy
// or a launch has finished when the call returns), so stream concurrency is not modelled. Copies
// check their direction against the registry of device allocations, as the GPU's address spaces would.
#include <cuda_runtime_api.h>

#include <chrono>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda_on_cpu/memory.h"

struct CUstream_st {
  int id;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded;
};

namespace gs_emu {
namespace {

std::mutex g_mutex;
std::map<const unsigned char*, Allocation> g_allocations;  // by base address
std::set<const CUstream_st*> g_streams;
std::set<const CUevent_st*> g_events;
cudaError_t g_last_error = cudaSuccess;

}  // namespace

std::recursive_mutex& device_lock() {
  static std::recursive_mutex lock;
  return lock;
}

namespace {

cudaError_t fail(cudaError_t e, const std::string& why) {
  report_fault(e, why);
  return e;
}

const Allocation* find_locked(const void* p, std::size_t bytes) {
  const auto* q = static_cast<const unsigned char*>(p);
  auto it = g_allocations.upper_bound(q);
  if (it == g_allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (q < a.base) return nullptr;
  const std::size_t offset = static_cast<std::size_t>(q - a.base);
  if (bytes == 0 ? offset > a.size : (offset >= a.size || bytes > a.size - offset)) return nullptr;
  return &a;
}

bool stream_ok(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return s == nullptr || g_streams.count(s) != 0;
}

std::string describe(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

const char* kind_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
      return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// A copy's side: in one device allocation for the whole range, or (host) in no device allocation.
std::string check_side(const char* side, const void* p, std::size_t bytes, bool device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Allocation* a = find_locked(p, bytes);
  if (device) {
    if (a == nullptr && system_memory_is_device() && find_locked(p, 0) == nullptr) return "";
    if (a == nullptr || a->kind != MemoryKind::device)
      return std::string("the ") + side + " " + describe(p) + " (" + std::to_string(bytes) +
             " bytes) is not within one device allocation";
    return "";
  }
  const Allocation* any = find_locked(p, 0);
  if (any != nullptr && any->kind == MemoryKind::device)
    return std::string("the ") + side + " " + describe(p) + " is device memory, the copy's kind says host";
  return "";
}

cudaError_t copy(const char* call, void* dst, const void* src, std::size_t count, cudaMemcpyKind kind,
                 cudaStream_t stream) {
  const std::lock_guard<std::recursive_mutex> device(device_lock());
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle, std::string(call) + ": unknown stream");
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr)
    return fail(cudaErrorInvalidValue, std::string(call) + ": null pointer");
  bool dst_device = false, src_device = false;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      dst_device = true;
      break;
    case cudaMemcpyDeviceToHost:
      src_device = true;
      break;
    case cudaMemcpyDeviceToDevice:
      dst_device = src_device = true;
      break;
    default:
      return fail(cudaErrorInvalidMemcpyDirection,
                  std::string(call) + ": " + kind_name(kind) + " is not a direction lib/cuda uses");
  }
  std::string bad = check_side("destination", dst, count, dst_device);
  if (bad.empty()) bad = check_side("source", src, count, src_device);
  if (!bad.empty())
    return fail(cudaErrorInvalidValue, std::string(call) + " with " + kind_name(kind) + ": " + bad);
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t allocate(void** p, std::size_t bytes, MemoryKind kind, const char* call) {
  const std::lock_guard<std::recursive_mutex> device(device_lock());
  if (p == nullptr) return fail(cudaErrorInvalidValue, std::string(call) + ": null result pointer");
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* q = nullptr;
  // 256-byte aligned as cudaMalloc's; exactly `bytes` long, so that AddressSanitizer sees an overrun.
  if (posix_memalign(&q, 256, bytes) != 0 || q == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[static_cast<unsigned char*>(q)] = Allocation{static_cast<unsigned char*>(q), bytes, kind};
  *p = q;
  return cudaSuccess;
}

cudaError_t release(void* p, MemoryKind kind, const char* call) {
  const std::lock_guard<std::recursive_mutex> device(device_lock());
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_allocations.find(static_cast<unsigned char*>(p));
    if (it == g_allocations.end() || it->second.kind != kind) {
      g_last_error = cudaErrorInvalidValue;
      std::cerr << "cuda on cpu: " << call << "(" << p << "): not an allocation of this kind\n";
      return cudaErrorInvalidValue;
    }
    g_allocations.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

}  // namespace

namespace {
std::atomic<bool> g_system_memory_is_device{false};
}  // namespace

void set_system_memory_is_device(bool on) {
  g_system_memory_is_device = on;
}

bool system_memory_is_device() {
  return g_system_memory_is_device;
}

const Allocation* find_allocation(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return find_locked(p, bytes);
}

std::vector<Allocation> allocations() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Allocation> all;
  all.reserve(g_allocations.size());
  for (const auto& entry : g_allocations) all.push_back(entry.second);
  return all;
}

void report_fault(cudaError_t e, const std::string& why) {
  std::cerr << "cuda on cpu: " << cudaGetErrorName(e) << ": " << why << "\n";
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_last_error == cudaSuccess) g_last_error = e;
}

}  // namespace gs_emu

using gs_emu::fail;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (p == nullptr) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  *p = cudaDeviceProp{};
  std::strncpy(p->name, "gradscale CPU execution target (emulated)", sizeof p->name - 1);
  p->major = 0;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->totalGlobalMem = std::size_t{1} << 30;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
  const cudaError_t e = gs_emu::g_last_error;
  gs_emu::g_last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return "unrecognized error code";
  }
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (s == nullptr) return cudaErrorInvalidValue;
  static int next_id = 1;
  *s = new CUstream_st{next_id++};
  std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
  gs_emu::g_streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
    if (s == nullptr || gs_emu::g_streams.erase(s) == 0) return cudaErrorInvalidResourceHandle;
  }
  delete s;
  return cudaSuccess;
}

// The work queued on a stream has run already; a fault of it was reported by the launch check, or is
// reported here if nothing asked since.
// The same: a queried stream is always idle.
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!gs_emu::stream_ok(s)) return cudaErrorInvalidResourceHandle;
  return cudaGetLastError();
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!gs_emu::stream_ok(s)) return cudaErrorInvalidResourceHandle;
  return cudaGetLastError();
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  return gs_emu::allocate(p, bytes, gs_emu::MemoryKind::device, "cudaMalloc");
}
cudaError_t cudaFree(void* p) {
  return gs_emu::release(p, gs_emu::MemoryKind::device, "cudaFree");
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return gs_emu::allocate(p, bytes, gs_emu::MemoryKind::pinned_host, "cudaMallocHost");
}
cudaError_t cudaFreeHost(void* p) {
  return gs_emu::release(p, gs_emu::MemoryKind::pinned_host, "cudaFreeHost");
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return gs_emu::copy("cudaMemcpy", dst, src, count, kind, nullptr);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t s) {
  return gs_emu::copy("cudaMemcpyAsync", dst, src, count, kind, s);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t s) {
  if (!gs_emu::stream_ok(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: unknown stream");
  if (count == 0) return cudaSuccess;
  const std::lock_guard<std::recursive_mutex> device(gs_emu::device_lock());
  const std::string bad = gs_emu::check_side("destination", p, count, true);
  if (!bad.empty()) return fail(cudaErrorInvalidValue, "cudaMemsetAsync: " + bad);
  std::memset(p, value, count);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (e == nullptr) return cudaErrorInvalidValue;
  *e = new CUevent_st{{}, false};
  std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
  gs_emu::g_events.insert(*e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
    if (e == nullptr || gs_emu::g_events.erase(e) == 0) return cudaErrorInvalidResourceHandle;
  }
  delete e;
  return cudaSuccess;
}

// The work queued before the event has run: its time is now.
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!gs_emu::stream_ok(s)) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
    if (e == nullptr || gs_emu::g_events.count(e) == 0) return cudaErrorInvalidResourceHandle;
  }
  e->at = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cudaErrorInvalidValue;
  {
    std::lock_guard<std::mutex> lock(gs_emu::g_mutex);
    if (gs_emu::g_events.count(start) == 0 || gs_emu::g_events.count(end) == 0)
      return cudaErrorInvalidResourceHandle;
  }
  if (!start->recorded || !end->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

}  // extern "C"
