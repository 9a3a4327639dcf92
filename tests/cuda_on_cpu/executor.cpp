// The CPU execution target of lib/cuda: the executor (see executor.h). Each CUDA thread of a block runs
// on a fiber (its own stack; a switch saves the callee-saved registers and swaps stack pointers). A pass
// runs the block's threads in the run's order: a thread that reaches __syncthreads or a warp operation
// switches straight to the next one, a thread that ends hands its fiber to the next that has not
// started. After the pass the scheduler releases every warp, or the block, whose threads have all
// arrived, with what the operation returns, and starts the next pass.
#include "tests/cuda_on_cpu/executor.h"

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda_on_cpu/executor_state.h"

#if !defined(__x86_64__)
#error "tests/cuda_on_cpu switches fibers with x86-64 code: port gs_emu_switch to this machine"
#endif

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

namespace gs_emu::detail {

Executor g_exec;
ThreadContext g_current;

namespace {

uint3 thread_index(unsigned linear) {
  const dim3& b = g_exec.config->block;
  return uint3{linear % b.x, (linear / b.x) % b.y, linear / (b.x * b.y)};
}

}  // namespace

void note_fault(const std::string& why) {
  if (!g_exec.fault.empty()) return;
  std::ostringstream os;
  os << why << " (block " << g_exec.block.x << "," << g_exec.block.y << "," << g_exec.block.z << ")";
  g_exec.fault = os.str();
}

namespace {

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

}  // namespace

// The running thread waits (its state says where): on to the pass's next thread.
void wait_here() {
  Thread& th = g_exec.thread[static_cast<unsigned>(g_exec.running)];
  Fiber& f = *g_exec.fibers[static_cast<std::size_t>(th.fiber)];
  switch_to(&f.sp, &f.fake_stack, next_in_pass());
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

}  // namespace gs_emu::detail

namespace gs_emu {

ThreadContext& current() {
  return detail::g_current;
}

}  // namespace gs_emu
