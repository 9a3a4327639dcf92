// The MPI backend of the communicator (communicator.h), built when CMake finds MPI (GRADSCALE_MPI).
// Each collective is started non-blocking and waited for with a deadline: a rank that died or hangs
// makes the others throw DistributedError after `timeout_seconds`, instead of waiting forever.
#pragma once

#ifndef GRADSCALE_MPI
#error "lib/dist/mpi_communicator.h needs the MPI build (GRADSCALE_MPI): link gradscale::mpi (the package's mpi component; in this tree, gradscale_mpi, built when CMake finds MPI)"
#endif

#include <memory>

#include "lib/dist/communicator.h"

namespace gradscale {

// Whether this process was started by an MPI launcher (mpirun, srun): its environment names a rank.
// Read before MPI is initialised, so a single process never initialises MPI.
bool launched_by_mpi();

// MPI_Init (once per process), MPI_COMM_WORLD. The object finalizes MPI when it is destroyed.
std::unique_ptr<Communicator> make_mpi_communicator(double timeout_seconds);

}  // namespace gradscale
