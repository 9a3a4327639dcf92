// The CPU execution target of lib/cuda: __syncthreads and the warp operations (see executor.h). A
// thread that reaches one waits on its fiber; after each pass the block's scheduler (executor.cpp) releases
// every warp, or the block, whose threads have all arrived, with what the operation returns.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "tests/cuda_on_cpu/executor.h"
#include "tests/cuda_on_cpu/executor_state.h"

namespace gs_emu::detail {

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

}  // namespace gs_emu::detail

namespace gs_emu {

using namespace detail;

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

}  // namespace gs_emu
