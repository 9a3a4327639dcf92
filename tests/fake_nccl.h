// What the stand-in NCCL library (tests/fake_nccl.cpp) records of the calls gradscale's NCCL loader
// makes (lib/cuda/collectives.cpp); a test reads it through the library's fake_nccl_log entry.
#pragma once

#include <cstddef>

namespace gradscale::test {

struct FakeNcclLog {
  int comms_initialised = 0;  // ncclCommInitRank calls that succeeded
  int comms_destroyed = 0;
  int comms_aborted = 0;
  int all_reduces = 0;  // float sums in place: anything else is refused with ncclInvalidArgument
  std::size_t last_count = 0;
  const void* last_stream = nullptr;
};

}  // namespace gradscale::test
