// The CPU execution target of lib/cuda: a kernel launch (see executor.h). Its configuration and pointer
// arguments are checked, its blocks run one after the other, and it runs a second time, threads and
// blocks reversed, over the same starting bytes: different bytes written are a race or a missing barrier.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda_on_cpu/executor.h"
#include "tests/cuda_on_cpu/executor_state.h"
#include "tests/cuda_on_cpu/memory.h"

namespace gs_emu::detail {
namespace {

constexpr unsigned kMaxThreads = 1024;

void run_grid(bool reversed) {
  const LaunchConfig& c = *g_exec.config;
  g_exec.reversed = reversed;
  const std::size_t blocks = static_cast<std::size_t>(c.grid.x) * c.grid.y * c.grid.z;
  g_current.block_dim = c.block;
  g_current.grid_dim = c.grid;
  for (std::size_t i = 0; i < blocks; ++i) {
    const std::size_t b = reversed ? blocks - 1 - i : i;
    g_exec.block =
        uint3{static_cast<unsigned>(b % c.grid.x), static_cast<unsigned>((b / c.grid.x) % c.grid.y),
              static_cast<unsigned>(b / (static_cast<std::size_t>(c.grid.x) * c.grid.y))};
    g_current.block_idx = g_exec.block;
    run_block();
  }
}

std::string where(const LaunchConfig& c) {
  std::string file = c.file;
  const std::size_t slash = file.rfind("lib/cuda/");
  if (slash != std::string::npos) file = file.substr(slash);
  return "kernel launched at " + file + ":" + std::to_string(c.line);
}

// Whether this launch runs in both orders: every launch when GS_CUDA_ON_CPU_ORDERS=all, else the first
// kFirstChecked launches of each launch site (file:line) and one in kCheckEvery after them. Copying
// and comparing the whole device memory at each of a training run's thousands of launches would cost
// more than running them; the sites' first launches cover every kernel at every shape a test gives it.
bool order_check_due(const LaunchConfig& c) {
  constexpr unsigned kFirstChecked = 3, kCheckEvery = 64;
  static const bool all = [] {
    const char* v = std::getenv("GS_CUDA_ON_CPU_ORDERS");
    return v != nullptr && std::string(v) == "all";
  }();
  if (all) return true;
  static std::map<std::pair<std::string, int>, unsigned> launches;
  const unsigned n = launches[{c.file, c.line}]++;
  return n < kFirstChecked || n % kCheckEvery == 0;
}

}  // namespace
}  // namespace gs_emu::detail

namespace gs_emu {

using namespace detail;

void note_pointer(LaunchConfig& c, int index, const void* p) {
  if (c.pointer_count >= LaunchConfig::kMaxPointers) return;
  c.pointers[c.pointer_count] = p;
  c.pointer_index[c.pointer_count] = index;
  ++c.pointer_count;
}

namespace {
std::atomic<unsigned long long> launch_count{0};
}  // namespace

unsigned long long launches() noexcept {
  return launch_count.load();
}

void run_kernel(const LaunchConfig& c, void (*body)(void*), void* data) {
  const std::lock_guard<std::recursive_mutex> device(device_lock());
  ++launch_count;
  const unsigned long long threads = static_cast<unsigned long long>(c.block.x) * c.block.y * c.block.z;
  if (threads == 0 || threads > kMaxThreads || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 ||
      c.grid.z == 0 || c.grid.y > 65535 || c.grid.z > 65535) {
    std::ostringstream os;
    os << where(c) << ": invalid configuration: grid (" << c.grid.x << "," << c.grid.y << "," << c.grid.z
       << "), block (" << c.block.x << "," << c.block.y << "," << c.block.z << ")";
    report_fault(cudaErrorInvalidConfiguration, os.str());
    return;
  }
  if (c.shared != 0) {
    report_fault(cudaErrorInvalidConfiguration, where(c) + ": dynamic shared memory is not emulated");
    return;
  }
  for (int i = 0; i < c.pointer_count; ++i) {
    if (c.pointers[i] == nullptr || find_allocation(c.pointers[i], 0) != nullptr || system_memory_is_device())
      continue;
    std::ostringstream os;
    os << where(c) << ": argument " << c.pointer_index[i] << " (" << c.pointers[i]
       << ") points outside device memory";
    report_fault(cudaErrorIllegalAddress, os.str());
    return;
  }
#ifdef GS_EMU_ASAN
  if (g_exec.scheduler_stack == nullptr) {  // the launching thread's stack, for the switches back to it
    pthread_attr_t attr;
    void* addr = nullptr;
    pthread_getattr_np(pthread_self(), &attr);
    pthread_attr_getstack(&attr, &addr, &g_exec.scheduler_stack_size);
    pthread_attr_destroy(&attr);
    g_exec.scheduler_stack = addr;
  }
#endif
  g_exec.config = &c;
  g_exec.body = body;
  g_exec.data = data;
  g_exec.threads = static_cast<unsigned>(threads);
  g_exec.fault.clear();

  if (system_memory_is_device() || !order_check_due(c)) {
    run_grid(false);
    g_exec.config = nullptr;
    if (!g_exec.fault.empty()) report_fault(cudaErrorLaunchFailure, where(c) + ": " + g_exec.fault);
    return;
  }
  // Forward, then reversed over the same starting bytes; the forward run's bytes are what stays.
  // Every device allocation, and the page-locked host ones the kernel was handed: the others are the
  // host's to write at any time (another host thread's staging buffer, tests/test_cuda_distributed.cpp),
  // and restoring them would undo its writes.
  std::vector<Allocation> memory = allocations();
  memory.erase(std::remove_if(memory.begin(), memory.end(),
                              [&c](const Allocation& a) {
                                if (a.kind == MemoryKind::device) return false;
                                for (int i = 0; i < c.pointer_count; ++i) {
                                  const auto* p = static_cast<const unsigned char*>(c.pointers[i]);
                                  if (p >= a.base && p < a.base + a.size) return false;
                                }
                                return true;
                              }),
               memory.end());
  std::size_t total = 0;
  for (const Allocation& a : memory) total += a.size;
  static std::vector<unsigned char> before, forward;  // reused: launches are many, memory is small
  before.resize(total);
  forward.resize(total);
  std::size_t at = 0;
  for (const Allocation& a : memory) {
    if (a.size != 0) std::memcpy(before.data() + at, a.base, a.size);
    at += a.size;
  }
  run_grid(false);
  at = 0;
  for (const Allocation& a : memory) {
    if (a.size != 0) {
      std::memcpy(forward.data() + at, a.base, a.size);
      std::memcpy(a.base, before.data() + at, a.size);
    }
    at += a.size;
  }
  run_grid(true);
  at = 0;
  std::string race;
  for (const Allocation& a : memory) {
    if (a.size != 0 && race.empty() && std::memcmp(forward.data() + at, a.base, a.size) != 0) {
      std::size_t i = 0;
      while (forward[at + i] == a.base[i]) ++i;
      std::ostringstream os;
      os << where(c) << ": threads run in forward and in reversed order write different bytes (a race or "
         << "a missing barrier): first at byte " << i << " of the " << a.size << "-byte "
         << (a.kind == MemoryKind::device ? "device" : "page-locked host") << " allocation "
         << static_cast<void*>(a.base) << " (forward 0x" << std::hex << static_cast<int>(forward[at + i])
         << ", reversed 0x" << static_cast<int>(a.base[i]) << ")";
      race = os.str();
    }
    if (a.size != 0) std::memcpy(a.base, forward.data() + at, a.size);
    at += a.size;
  }
  g_exec.config = nullptr;
  if (!g_exec.fault.empty()) {
    report_fault(cudaErrorLaunchFailure, where(c) + ": " + g_exec.fault);
  } else if (!race.empty()) {
    report_fault(cudaErrorLaunchFailure, race);
  }
}

}  // namespace gs_emu
