// How `gradscale train` finds its ranks: under an MPI launcher (mpirun -np N, srun) the MPI
// communicator, else one process with no MPI at all (lib/dist/communicator.h).
#pragma once

#include <memory>

#include "lib/dist/communicator.h"

namespace gradscale::cli {

// The communicator of this process: MPI when an MPI launcher started it (and the build has MPI),
// else LocalCommunicator. ConfigError when a launcher asked for several ranks and the build has no MPI.
// `timeout_seconds`: how long a collective waits for the other ranks.
std::unique_ptr<Communicator> make_communicator(double timeout_seconds);

}  // namespace gradscale::cli
