// The communicator of `gradscale train` (see dist_launch.h).
#include "experiments/cli/dist_launch.h"

#include <cstdlib>
#include <string>

#include "lib/core/error.h"
#ifdef GRADSCALE_MPI
#include "lib/dist/mpi_communicator.h"
#endif

namespace gradscale::cli {

std::unique_ptr<Communicator> make_communicator(double timeout_seconds) {
#ifdef GRADSCALE_MPI
  if (launched_by_mpi()) return make_mpi_communicator(timeout_seconds);
#else
  (void)timeout_seconds;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* size = std::getenv(var);
    GS_CHECK_CONFIG(!size || std::string(size) == "1",
                    "started as one of " << size << " ranks (" << var << "), but this gradscale was built "
                                         << "without MPI: install libopenmpi-dev (scripts/setup.sh) and rebuild");
  }
#endif
  return std::make_unique<LocalCommunicator>();
}

}  // namespace gradscale::cli
