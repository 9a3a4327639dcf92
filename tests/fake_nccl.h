// The stand-in NCCL library's state (tests/fake_nccl.cpp): what a test sets before gradscale's NCCL
// loader (lib/cuda/collectives.cpp) calls it, and what it records of those calls. A test reaches it
// through the library's fake_nccl entry.
#pragma once

#include <cstddef>

namespace gradscale::test {

struct FakeNccl {
  // Set by a test. After a call returns ncclInProgress, ncclCommGetAsyncError reports ncclInProgress
  // this many times (-1: for ever), then ncclSuccess, or ncclSystemError when `progress_fails`.
  int start_polls = 0;       // ncclCommInitRankConfig returns ncclInProgress when this is not 0
  int all_reduce_polls = 0;  // likewise ncclAllReduce
  bool progress_fails = false;
  // Recorded.
  int comms_started = 0;  // ncclCommInitRankConfig calls accepted (nonblocking config, rank 0's id)
  int comms_destroyed = 0;
  int comms_aborted = 0;
  int all_reduces = 0;  // float sums in place: anything else is refused with ncclInvalidArgument
  int state_polls = 0;  // ncclCommGetAsyncError calls
  std::size_t last_count = 0;
  const void* last_stream = nullptr;
};

}  // namespace gradscale::test
