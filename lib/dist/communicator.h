// The seam between training and the processes it runs on (docs/distributed.md): rank and size, and
// the few collectives data-parallel training needs — all-reduce (sum, max) over a buffer, all-gather,
// broadcast, barrier. A single process uses LocalCommunicator (size 1, every collective the identity)
// and needs no MPI; mpi_communicator.h is the backend for `mpirun -np N`.
//
// Contract of every collective: every rank calls it in the same order with the same n; it returns
// on every rank with the same result; buffers are the caller's. A backend that waits longer than its
// timeout for the other ranks throws DistributedError naming the collective (a rank that died or
// hangs ends the others with a clear error, never a hang).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/core/error.h"

namespace gradscale {

// Another rank died, hangs, or disagrees (a config that differs, ranks that drifted apart).
class DistributedError : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi"
  // This rank's index among the ranks on its machine (which GPU it takes when each has its own).
  virtual int local_rank() const { return rank(); }
  // How long a collective waits for the other ranks before it throws (0: it waits as long as it takes).
  virtual double timeout_seconds() const { return 0.0; }
  // In place: data[i] = Σ over ranks. Integer sums are exact and order-free.
  virtual void all_reduce_sum(std::uint64_t* data, std::size_t n) = 0;
  // In place, fp32 (the gradients): the order of the sum is the backend's, the same on every rank.
  virtual void all_reduce_sum(float* data, std::size_t n) = 0;
  // In place: data[i] = max over ranks (order-free, so exact). NaN must not be passed.
  virtual void all_reduce_max(double* data, std::size_t n) = 0;
  // out[r·n + i] = rank r's in[i]; out holds size()·n values. What makes sums of doubles exact across
  // runs: every rank adds the gathered values in rank order.
  virtual void all_gather(const double* in, std::size_t n, double* out) = 0;
  // root's bytes[0..n) into every rank's.
  virtual void broadcast(void* bytes, std::size_t n, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank now with `code` (after an error on this rank, so the others do not wait for it).
  [[noreturn]] virtual void abort(int code) = 0;
};

// Collectives over device memory: a GPU's weight gradients, summed without leaving the device (NCCL),
// or through the host over a Communicator (lib/cuda/collectives.h). Bound to one device and stream when
// made; the same contract as Communicator's (every rank, the same order and n, the same result).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // "nccl 2.28.9", "host (mpi)": for logs and results.
  virtual std::string backend() const = 0;
  // In place over n floats of device memory: data[i] = Σ over ranks, the same bits on every rank.
  // Ordered after the work queued on the stream before it; the work queued after it sees the sum.
  virtual void all_reduce_sum(float* device_data, std::size_t n) = 0;
};

// One process: rank 0 of 1; the collectives leave their buffers as they are.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void all_reduce_sum(std::uint64_t*, std::size_t) override {}
  void all_reduce_sum(float*, std::size_t) override {}
  void all_reduce_max(double*, std::size_t) override {}
  void all_gather(const double* in, std::size_t n, double* out) override;
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override;
};

// Sums of doubles in a fixed order: the all-gather of `values` (n each), added in rank order.
void all_reduce_sum_ordered(Communicator& comm, double* values, std::size_t n);

}  // namespace gradscale
