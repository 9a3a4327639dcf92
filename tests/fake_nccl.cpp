// A stand-in for libnccl.so.2 over one rank, for the tests of gradscale's NCCL loader
// (tests/test_cuda_distributed.cpp): the entries lib/cuda/collectives.cpp binds, with the calls
// recorded, and a communicator that stays "in progress" (NCCL's nonblocking mode) for as many polls as a
// test sets, then succeeds or fails (tests/fake_nccl.h). A sum over one rank leaves the values as they
// are, so the fake moves no data and runs where no GPU is. Built twice (tests/CMakeLists.txt): whole,
// and with FAKE_NCCL_PARTIAL lacking ncclCommGetAsyncError, which the loader must name.
#include <nccl.h>

#include <cstring>

#include "tests/fake_nccl.h"

namespace {

gradscale::test::FakeNccl fake;
constexpr char kIdByte = 0x5a;  // what ncclGetUniqueId writes, and ncclCommInitRankConfig expects
struct FakeComm {
  int polls_left = 0;  // of ncclInProgress, after the last call that returned it (-1: for ever)
} fake_comm;

// A call that may stay in progress for `polls` polls.
ncclResult_t started(int polls) {
  fake_comm.polls_left = polls;
  return polls == 0 ? ncclSuccess : ncclInProgress;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) gradscale::test::FakeNccl* fake_nccl() { return &fake; }

__attribute__((visibility("default"))) ncclResult_t ncclGetVersion(int* version) {
  *version = 22899;  // 2.28.99: no real release
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, kIdByte, sizeof id->internal);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                                           ncclUniqueId id, int rank,
                                                                           ncclConfig_t* config) {
  if (nranks != 1 || rank != 0 || id.internal[0] != kIdByte || id.internal[sizeof id.internal - 1] != kIdByte ||
      config == nullptr || config->blocking != 0)
    return ncclInvalidArgument;
  *comm = reinterpret_cast<ncclComm_t>(&fake_comm);
  ++fake.comms_started;
  return started(fake.start_polls);
}

__attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                                                  ncclDataType_t datatype, ncclRedOp_t op,
                                                                  ncclComm_t comm, cudaStream_t stream) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm) || sendbuff != recvbuff || datatype != ncclFloat32 ||
      op != ncclSum)
    return ncclInvalidArgument;
  ++fake.all_reduces;
  fake.last_count = count;
  fake.last_stream = stream;
  return started(fake.all_reduce_polls);
}

__attribute__((visibility("default"))) ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm)) return ncclInvalidArgument;
  ++fake.comms_destroyed;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm)) return ncclInvalidArgument;
  ++fake.comms_aborted;
  return ncclSuccess;
}

#ifndef FAKE_NCCL_PARTIAL
__attribute__((visibility("default"))) ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm)) return ncclInvalidArgument;
  ++fake.state_polls;
  if (fake_comm.polls_left != 0) {
    if (fake_comm.polls_left > 0) --fake_comm.polls_left;
    *async_error = ncclInProgress;
  } else {
    *async_error = fake.progress_fails ? ncclSystemError : ncclSuccess;
  }
  return ncclSuccess;
}
#endif

__attribute__((visibility("default"))) const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error (fake)" : "an error (fake)";
}

}  // extern "C"
