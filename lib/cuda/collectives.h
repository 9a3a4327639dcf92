// Collectives over a GPU's memory for data-parallel training (lib/dist/communicator.h's
// DeviceCollectives, docs/distributed.md): what sums the weight gradients where they are.
//   - "nccl": NCCL's all-reduce, queued on the context's stream (no wait). The ranks share NCCL's
//     unique id over the host communicator (rank 0 makes it, a broadcast brings it to the others).
//     libnccl is loaded when first asked for (dlopen: a build with NCCL starts, and a single process
//     runs, where there is no libnccl), from GRADSCALE_NCCL_LIBRARY if set, else libnccl.so.2 on the
//     loader's path, else the one CMake found. While an NCCL communicator lives, the context's waits
//     poll (CudaContext::set_wait_watch): an error NCCL reports, or a wait longer than the host
//     communicator's timeout (a rank that died or hangs), aborts it and throws DistributedError.
//     The communicator is nonblocking, so NCCL's start and a call in progress are polled the same way.
//   - "host": the gradient is copied to page-locked host memory (one wait), summed there by the host
//     communicator (MPI), and copied back. Any MPI, any number of ranks per GPU.
//   - "auto": nccl when this build has it, else host.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <memory>
#include <string>

#include "lib/cuda/context.h"
#include "lib/dist/communicator.h"

namespace gradscale::cuda {

// ConfigError for an unknown kind, or "nccl" in a build without it; for "nccl", ConfigError when
// libnccl cannot be loaded (naming the library and why) and DistributedError when NCCL cannot start.
// Borrows ctx and comm: both must outlive the result.
std::unique_ptr<DeviceCollectives> make_device_collectives(CudaContext& ctx, Communicator& comm,
                                                           const std::string& kind);

// Whether this build has the NCCL backend (nccl.h was found when it was configured).
bool nccl_built();

}  // namespace gradscale::cuda
