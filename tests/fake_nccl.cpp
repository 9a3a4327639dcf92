// A stand-in for libnccl.so.2 over one rank, for the tests of gradscale's NCCL loader
// (tests/test_cuda_distributed.cpp): the entries lib/cuda/collectives.cpp binds, with the calls
// recorded (tests/fake_nccl.h). A sum over one rank leaves the values as they are, so the fake moves
// no data and runs where no GPU is. Built twice (tests/CMakeLists.txt): whole, and with
// FAKE_NCCL_PARTIAL lacking ncclCommGetAsyncError, which the loader must name.
#include <nccl.h>

#include <cstring>

#include "tests/fake_nccl.h"

namespace {

gradscale::test::FakeNcclLog fake_log;
constexpr char kIdByte = 0x5a;  // what ncclGetUniqueId writes, and ncclCommInitRank expects
struct FakeComm {
  int nranks = 0;
} fake_comm;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const gradscale::test::FakeNcclLog* fake_nccl_log() { return &fake_log; }

__attribute__((visibility("default"))) ncclResult_t ncclGetVersion(int* version) {
  *version = 22899;  // 2.28.99: no real release
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, kIdByte, sizeof id->internal);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                                     int rank) {
  if (nranks != 1 || rank != 0 || id.internal[0] != kIdByte || id.internal[sizeof id.internal - 1] != kIdByte)
    return ncclInvalidArgument;
  fake_comm.nranks = nranks;
  *comm = reinterpret_cast<ncclComm_t>(&fake_comm);
  ++fake_log.comms_initialised;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                                                  ncclDataType_t datatype, ncclRedOp_t op,
                                                                  ncclComm_t comm, cudaStream_t stream) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm) || sendbuff != recvbuff || datatype != ncclFloat32 ||
      op != ncclSum)
    return ncclInvalidArgument;
  ++fake_log.all_reduces;
  fake_log.last_count = count;
  fake_log.last_stream = stream;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm)) return ncclInvalidArgument;
  ++fake_log.comms_destroyed;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != reinterpret_cast<ncclComm_t>(&fake_comm)) return ncclInvalidArgument;
  ++fake_log.comms_aborted;
  return ncclSuccess;
}

#ifndef FAKE_NCCL_PARTIAL
__attribute__((visibility("default"))) ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* async_error) {
  *async_error = ncclSuccess;
  return ncclSuccess;
}
#endif

__attribute__((visibility("default"))) const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error (fake)" : "an error (fake)";
}

}  // extern "C"
