// gradscale public API — data-parallel training over ranks (docs/distributed.md).
//
//   Communicator        all-reduce (sum, max), all-gather, broadcast, barrier, rank and size; every
//                       rank makes the same calls in the same order. LocalCommunicator: one process.
//   ScaledTraining::distribute(comm, gpu_collectives)   makes a training one rank of `comm`: each rank
//                       runs the same calls on its rows of each batch, and every rank takes the same
//                       S0, per-layer scales, φ and skip. A model on the CUDA backend sums its weight
//                       gradients on the device: "nccl", "host" (over comm) or "auto".
//   DeviceCollectives   that sum over device memory (Backend::device_collectives makes one).
//   make_mpi_communicator(timeout_s), launched_by_mpi()   the MPI backend: only with the package's
//                       `mpi` component, find_package(gradscale CONFIG REQUIRED COMPONENTS mpi) and
//                       target_link_libraries(... gradscale::mpi), which defines GRADSCALE_MPI.
#pragma once
#include "lib/dist/communicator.h"
#if defined(GRADSCALE_MPI)
#include "lib/dist/mpi_communicator.h"
#endif
