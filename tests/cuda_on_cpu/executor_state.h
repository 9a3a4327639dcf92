// The CPU execution target of lib/cuda: the executor's state, shared by its three parts (executor.cpp:
// the fibers and a block's passes; executor_sync.cpp: __syncthreads and warp operations;
// executor_launch.cpp: a launch, run forward and reversed). Internal to tests/cuda_on_cpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda_on_cpu/executor.h"

#if defined(__SANITIZE_ADDRESS__)
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#define GS_EMU_ASAN 1
#endif

namespace gs_emu::detail {

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

// The one executor (launches are serialised by the device lock) and the running thread's built-ins.
extern Executor g_exec;
extern ThreadContext g_current;

// Records the first fault of this run, naming the block it happened in.
void note_fault(const std::string& why);
// The running thread waits (its state says where): on to the pass's next thread.
void wait_here();
// Runs every thread of the block g_exec.block until all have ended (executor.cpp).
void run_block();
// The waiting threads' operations (executor_sync.cpp): release a warp whose lanes have all arrived, or
// the block when every thread waits at __syncthreads or has ended. Each returns whether it did.
bool release_warp(unsigned warp);
bool release_barrier();

}  // namespace gs_emu::detail
