// The CPU execution target of lib/cuda: the executor (see executor.h). Each CUDA thread of a block runs
// on a fiber (its own stack; a switch saves the callee-saved registers and swaps stack pointers). A pass
// runs the block's threads in the run's order: a thread that reaches __syncthreads or a warp operation
// switches straight to the next one, a thread that ends hands its fiber to the next that has not
// started. After the pass the scheduler releases every warp, or the block, whose threads have all
// arrived, with what the operation returns, and starts the next pass.
#include "tests/cuda_on_cpu/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda_on_cpu/memory.h"

#if defined(__SANITIZE_ADDRESS__)
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#define GS_EMU_ASAN 1
#endif

namespace gs_emu {
namespace {

constexpr unsigned kMaxThreads = 1024;
#ifdef GS_EMU_ASAN
constexpr std::size_t kStackBytes = 256 * 1024;  // ASan's frames are larger
#else
constexpr std::size_t kStackBytes = 32 * 1024;  // small: a block's stacks stay in the caches
#endif

enum class State { idle, ready, at_barrier, at_warp, done };

struct Thread {
  State state = State::idle;
  uint3 idx{};
  int fiber = -1;
  // The operation it waits in.
  BarrierOp barrier_op = BarrierOp::plain;
  ShuffleOp shuffle_op = ShuffleOp::index;
  unsigned mask = 0;
  std::uint64_t value = 0;
  int arg = 0, width = 32;
  std::uint64_t result = 0;
};

#if !defined(__x86_64__)
#error "tests/cuda_on_cpu switches fibers with x86-64 code: port gs_emu_switch to this machine"
#endif

}  // namespace
}  // namespace gs_emu

// Saves the callee-saved registers on the running stack, stores its stack pointer in *save, continues on
// the stack `load` (saved by an earlier switch, or prepared by take_fiber) — the System V x86-64 ABI's
// callee-saved set; the kernels change neither the rounding mode nor the x87 control word.
extern "C" void gs_emu_switch(void** save, void* load);
asm(R"(
  .text
  .p2align 4
  .globl gs_emu_switch
  .type gs_emu_switch, @function
gs_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gs_emu_switch, .-gs_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace gs_emu {
namespace {

struct Fiber {
  void* sp = nullptr;  // its saved stack pointer while it is not running
  std::unique_ptr<unsigned char[]> stack;
  int index = 0;       // in Executor::fibers
  int thread = -1;     // the CUDA thread it runs, -1 when free
  bool fresh = false;  // not entered yet
  void* fake_stack = nullptr;
};

struct Executor {
  // The launch.
  const LaunchConfig* config = nullptr;
  void (*body)(void*) = nullptr;
  void* data = nullptr;
  unsigned threads = 0;
  uint3 block{};
  // The block.
  std::vector<Thread> thread;
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<int> free_fibers;
  void* scheduler_sp = nullptr;
  Fiber* starting = nullptr;  // the fiber fiber_main is entered on
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_size = 0;
  bool reversed = false;  // this run's order
  int pass_pos = -1;      // the pass over the block's threads has visited positions up to this one
  int running = -1;       // the CUDA thread on the CPU, -1 in the scheduler
  unsigned done = 0, at_barrier = 0;  // threads of the block that have exited, that wait at a barrier
  std::vector<unsigned> at_warp;      // per warp: its lanes that wait in a warp operation
  std::string fault;                  // the first fault of this run
};

Executor g_exec;
ThreadContext g_current;

uint3 thread_index(unsigned linear) {
  const dim3& b = g_exec.config->block;
  return uint3{linear % b.x, (linear / b.x) % b.y, linear / (b.x * b.y)};
}

void note_fault(const std::string& why) {
  if (!g_exec.fault.empty()) return;
  std::ostringstream os;
  os << why << " (block " << g_exec.block.x << "," << g_exec.block.y << "," << g_exec.block.z << ")";
  g_exec.fault = os.str();
}

int take_fiber();

// The next thread of the pass that can run (waiting to start, or released), -1 at the pass's end.
int next_in_pass() {
  const int n = static_cast<int>(g_exec.threads);
  while (++g_exec.pass_pos < n) {
    const int t = g_exec.reversed ? n - 1 - g_exec.pass_pos : g_exec.pass_pos;
    const State st = g_exec.thread[static_cast<unsigned>(t)].state;
    if (st == State::ready || st == State::idle) return t;
  }
  return -1;
}

void enter(unsigned t) {
  g_exec.running = static_cast<int>(t);
  g_current.thread_idx = g_exec.thread[t].idx;
}

// Saves the running context in *save_sp and continues thread t (on a fiber of its own, started now if
// it has not run yet), or the scheduler when t < 0: one switch per arrival at a barrier or warp
// operation, none between threads that run to their end.
void switch_to(void** save_sp, void** fake_save, int t) {
  void* load;
  const void* bottom;
  std::size_t size;
  if (t < 0) {
    g_exec.running = -1;
    load = g_exec.scheduler_sp;
    bottom = g_exec.scheduler_stack;
    size = g_exec.scheduler_stack_size;
  } else {
    Thread& th = g_exec.thread[static_cast<unsigned>(t)];
    if (th.state == State::idle) {
      th.fiber = take_fiber();
      g_exec.fibers[static_cast<std::size_t>(th.fiber)]->thread = t;
      th.state = State::ready;
    }
    Fiber& f = *g_exec.fibers[static_cast<std::size_t>(th.fiber)];
    if (f.fresh) {
      f.fresh = false;
      g_exec.starting = &f;
    }
    enter(static_cast<unsigned>(t));
    load = f.sp;
    bottom = f.stack.get();
    size = kStackBytes;
  }
#ifdef GS_EMU_ASAN
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save;
  (void)bottom;
  (void)size;
#endif
  gs_emu_switch(save_sp, load);
#ifdef GS_EMU_ASAN
  __sanitizer_finish_switch_fiber(*fake_save, nullptr, nullptr);
#endif
}

// A fiber's life: run the CUDA thread it was given; when it ends, run the pass's next thread that has
// not started here, without a switch, or park in the free list and switch to the next one that waits.
[[noreturn]] void fiber_main() {
  Fiber& f = *g_exec.starting;
#ifdef GS_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  for (;;) {
    g_exec.body(g_exec.data);
    Thread& th = g_exec.thread[static_cast<unsigned>(f.thread)];
    th.state = State::done;
    th.fiber = -1;
    ++g_exec.done;
    const int t = next_in_pass();
    if (t >= 0 && g_exec.thread[static_cast<unsigned>(t)].state == State::idle) {
      Thread& next = g_exec.thread[static_cast<unsigned>(t)];
      next.fiber = f.index;
      next.state = State::ready;
      f.thread = t;
      enter(static_cast<unsigned>(t));
      continue;
    }
    f.thread = -1;
    g_exec.free_fibers.push_back(f.index);
    switch_to(&f.sp, &f.fake_stack, t);  // back here when a thread is given to this fiber
  }
}

int take_fiber() {
  if (!g_exec.free_fibers.empty()) {
    const int i = g_exec.free_fibers.back();
    g_exec.free_fibers.pop_back();
    return i;
  }
  auto f = std::make_unique<Fiber>();
  f->stack.reset(new unsigned char[kStackBytes]);
  // The first switch to it pops six zero registers and "returns" into fiber_main with the stack
  // aligned as after a call (rsp + 8 a multiple of 16).
  auto top = reinterpret_cast<std::uintptr_t>(f->stack.get() + kStackBytes) & ~std::uintptr_t{15};
  auto* frame = reinterpret_cast<std::uintptr_t*>(top - 64);
  for (int i = 0; i < 6; ++i) frame[i] = 0;
  frame[6] = reinterpret_cast<std::uintptr_t>(&fiber_main);
  frame[7] = 0;
  f->sp = frame;
  f->fresh = true;
  f->index = static_cast<int>(g_exec.fibers.size());
  g_exec.fibers.push_back(std::move(f));
  return static_cast<int>(g_exec.fibers.size() - 1);
}

// The running thread waits (its state says where): on to the pass's next thread.
void wait_here() {
  Thread& th = g_exec.thread[static_cast<unsigned>(g_exec.running)];
  Fiber& f = *g_exec.fibers[static_cast<std::size_t>(th.fiber)];
  switch_to(&f.sp, &f.fake_stack, next_in_pass());
}

// The waiting threads' operation: releases a warp whose lanes have all arrived. Returns whether it did.
bool release_warp(unsigned warp) {
  const unsigned first = warp * 32, end = std::min(first + 32, g_exec.threads);
  int leader = -1;
  for (unsigned t = first; t < end; ++t)
    if (g_exec.thread[t].state == State::at_warp) {
      leader = static_cast<int>(t);
      break;
    }
  if (leader < 0) return false;
  const Thread& lead = g_exec.thread[static_cast<unsigned>(leader)];
  const unsigned mask = lead.mask;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    const unsigned t = first + lane;
    if (t >= end || g_exec.thread[t].state == State::done) {
      std::ostringstream os;
      os << "a warp operation names lane " << lane << " (mask 0x" << std::hex << mask << std::dec
         << ") of warp " << warp << ", which " << (t >= end ? "does not exist" : "has exited");
      note_fault(os.str());
      for (unsigned u = first; u < end; ++u)  // go on with the lanes' own values
        if (g_exec.thread[u].state == State::at_warp) {
          g_exec.thread[u].result = g_exec.thread[u].value;
          g_exec.thread[u].state = State::ready;
          --g_exec.at_warp[warp];
        }
      return true;
    }
    if (g_exec.thread[t].state != State::at_warp) return false;  // not arrived yet (or at a barrier)
  }
  for (unsigned t = first; t < end; ++t) {
    const Thread& th = g_exec.thread[t];
    if (th.state == State::at_warp && (th.mask != mask || th.shuffle_op != lead.shuffle_op)) {
      note_fault("the lanes of warp " + std::to_string(warp) +
                 " meet in different warp operations (or with different masks)");
      break;
    }
  }
  std::uint64_t ballot = 0;
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((mask >> lane & 1u) && g_exec.thread[first + lane].value != 0) ballot |= std::uint64_t{1} << lane;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    Thread& th = g_exec.thread[first + lane];
    const int w = th.width, l = static_cast<int>(lane), base = l - l % w;
    int src = l;
    switch (th.shuffle_op) {
      case ShuffleOp::index:
        src = base + ((th.arg % w) + w) % w;
        break;
      case ShuffleOp::up:
        src = l % w >= th.arg ? l - th.arg : l;
        break;
      case ShuffleOp::down:
        src = l % w + th.arg < w ? l + th.arg : l;
        break;
      case ShuffleOp::bfly:
        src = l ^ th.arg;
        if (src / w != l / w) src = l;
        break;
      case ShuffleOp::ballot:
        break;
    }
    if (th.shuffle_op == ShuffleOp::ballot) {
      th.result = ballot;
    } else if (src < 0 || src >= 32 || !(mask >> src & 1u)) {
      note_fault("a shuffle of warp " + std::to_string(warp) + " reads lane " + std::to_string(src) +
                 ", which is not in its mask");
      th.result = th.value;
    } else {
      th.result = g_exec.thread[first + static_cast<unsigned>(src)].value;
    }
  }
  for (unsigned lane = 0; lane < 32; ++lane)
    if (mask >> lane & 1u) {
      g_exec.thread[first + lane].state = State::ready;
      --g_exec.at_warp[warp];
    }
  return true;
}

bool release_barrier() {
  if (g_exec.at_barrier + g_exec.done != g_exec.threads) return false;
  int reduced = 0, count = 0;
  bool any = false, all = true;
  BarrierOp op = BarrierOp::plain;
  for (unsigned t = 0; t < g_exec.threads; ++t) {
    const Thread& th = g_exec.thread[t];
    if (th.state == State::done) continue;
    if (th.state != State::at_barrier) return false;
    op = th.barrier_op;
    any = any || th.value != 0;
    all = all && th.value != 0;
    count += th.value != 0;
  }
  switch (op) {
    case BarrierOp::plain:
      reduced = 0;
      break;
    case BarrierOp::any:
      reduced = any;
      break;
    case BarrierOp::all:
      reduced = all;
      break;
    case BarrierOp::count:
      reduced = count;
      break;
  }
  for (unsigned t = 0; t < g_exec.threads; ++t) {
    Thread& th = g_exec.thread[t];
    if (th.state == State::done) continue;
    if (th.barrier_op != op) note_fault("the threads of a block meet in different kinds of __syncthreads");
    th.result = static_cast<std::uint64_t>(reduced);
    th.state = State::ready;
  }
  g_exec.at_barrier = 0;
  return true;
}

void run_block() {
  const unsigned n = g_exec.threads;
  g_exec.thread.assign(n, Thread{});
  for (unsigned t = 0; t < n; ++t) g_exec.thread[t].idx = thread_index(t);
  g_exec.done = 0;
  g_exec.at_barrier = 0;
  g_exec.at_warp.assign((n + 31) / 32, 0);
  for (;;) {
    // A pass: every thread that can run runs, in the run's order, until it waits or ends.
    g_exec.pass_pos = -1;
    const int first = next_in_pass();
    if (first >= 0) {
      void* fake = nullptr;
      switch_to(&g_exec.scheduler_sp, &fake, first);
    }
    bool released = false;
    for (unsigned w = 0; w < (n + 31) / 32; ++w)
      if (g_exec.at_warp[w] != 0) released = release_warp(w) || released;
    if (released) continue;
    if (g_exec.done == n) return;
    if (release_barrier()) continue;
    // Some threads wait at __syncthreads while others wait in a warp operation that cannot complete.
    note_fault("deadlock: threads wait at __syncthreads while others of the block wait in a warp operation");
    // Abandon the block's fibers: their stacks hold only the kernel's plain locals. Fresh ones follow.
    g_exec.fibers.clear();
    g_exec.free_fibers.clear();
    return;
  }
}

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

ThreadContext& current() {
  return g_current;
}

int block_barrier(BarrierOp op, int value) {
  if (g_exec.running < 0) return value;  // not in a kernel (never reached by lib/cuda)
  Thread& th = g_exec.thread[static_cast<unsigned>(g_exec.running)];
  th.state = State::at_barrier;
  th.barrier_op = op;
  th.value = static_cast<std::uint64_t>(value);
  ++g_exec.at_barrier;
  wait_here();
  return static_cast<int>(th.result);
}

std::uint64_t warp_shuffle(ShuffleOp op, unsigned mask, std::uint64_t value, int arg, int width) {
  Thread& th = g_exec.thread[static_cast<unsigned>(g_exec.running)];
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
    note_fault("a warp operation's width " + std::to_string(width) + " is not a power of two in [1, 32]");
    width = 32;
  }
  th.state = State::at_warp;
  ++g_exec.at_warp[static_cast<unsigned>(g_exec.running) / 32];
  th.shuffle_op = op;
  th.mask = mask;
  th.value = value;
  th.arg = arg;
  th.width = width;
  wait_here();
  return th.result;
}

unsigned live_lanes() {
  const unsigned first = static_cast<unsigned>(g_exec.running) / 32 * 32;
  unsigned lanes = 0;
  for (unsigned lane = 0; lane < 32 && first + lane < g_exec.threads; ++lane)
    if (g_exec.thread[first + lane].state != State::done) lanes |= 1u << lane;
  return lanes;
}

void note_pointer(LaunchConfig& c, int index, const void* p) {
  if (c.pointer_count >= LaunchConfig::kMaxPointers) return;
  c.pointers[c.pointer_count] = p;
  c.pointer_index[c.pointer_count] = index;
  ++c.pointer_count;
}

void run_kernel(const LaunchConfig& c, void (*body)(void*), void* data) {
  const std::lock_guard<std::recursive_mutex> device(device_lock());
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
