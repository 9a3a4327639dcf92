// The single-process communicator and the ordered sum (see communicator.h).
#include "lib/dist/communicator.h"

#include <cstdlib>
#include <vector>

namespace gradscale {

void LocalCommunicator::all_gather(const double* in, std::size_t n, double* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
}

void LocalCommunicator::abort(int code) {
  std::exit(code);
}

void all_reduce_sum_ordered(Communicator& comm, double* values, std::size_t n) {
  if (comm.size() == 1 || n == 0) return;
  const auto ranks = static_cast<std::size_t>(comm.size());
  std::vector<double> all(ranks * n);
  comm.all_gather(values, n, all.data());
  for (std::size_t i = 0; i < n; ++i) {
    double s = 0;  // rank 0 first, then 1, …: the same bits on every rank and in every run
    for (std::size_t r = 0; r < ranks; ++r) s += all[r * n + i];
    values[i] = s;
  }
}

}  // namespace gradscale
