// MPI as the communicator (see mpi_communicator.h): MPI_Iallreduce / MPI_Iallgather / MPI_Ibcast /
// MPI_Ibarrier, then MPI_Test until done or the deadline.
#include "lib/dist/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <limits>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace gradscale {
namespace {

#define GS_MPI_CHECK(call)                                                                            \
  do {                                                                                                \
    const int gs_mpi_rc = (call);                                                                     \
    if (gs_mpi_rc != MPI_SUCCESS) {                                                                   \
      char gs_mpi_text[MPI_MAX_ERROR_STRING] = {};                                                    \
      int gs_mpi_len = 0;                                                                             \
      MPI_Error_string(gs_mpi_rc, gs_mpi_text, &gs_mpi_len);                                          \
      throw DistributedError(std::string(#call) + " failed at " + __FILE__ + ":" +                    \
                             std::to_string(__LINE__) + ": " + gs_mpi_text);                          \
    }                                                                                                 \
  } while (0)

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_seconds) : timeout_(timeout_seconds) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      GS_MPI_CHECK(MPI_Init(nullptr, nullptr));
      owns_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    GS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    GS_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    // The ranks that share this machine's memory, numbered from 0: which GPU a rank takes.
    MPI_Comm node = MPI_COMM_NULL;
    GS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    GS_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_Comm_free(&node);
  }
  ~MpiCommunicator() override {
    if (owns_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  int local_rank() const override { return local_rank_; }
  double timeout_seconds() const override { return timeout_; }

  void all_reduce_sum(std::uint64_t* data, std::size_t n) override {
    MPI_Request req;
    GS_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD, &req));
    wait(req, "all-reduce (sum) of", n, "integers");
  }
  void all_reduce_sum(float* data, std::size_t n) override {
    MPI_Request req;
    GS_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req));
    wait(req, "all-reduce (sum) of", n, "floats");
  }
  void all_reduce_max(double* data, std::size_t n) override {
    MPI_Request req;
    GS_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req));
    wait(req, "all-reduce (max) of", n, "doubles");
  }
  void all_gather(const double* in, std::size_t n, double* out) override {
    MPI_Request req;
    GS_MPI_CHECK(MPI_Iallgather(in, count(n), MPI_DOUBLE, out, count(n), MPI_DOUBLE, MPI_COMM_WORLD, &req));
    wait(req, "all-gather of", n, "doubles");
  }
  void broadcast(void* bytes, std::size_t n, int root) override {
    MPI_Request req;
    GS_MPI_CHECK(MPI_Ibcast(bytes, count(n), MPI_BYTE, root, MPI_COMM_WORLD, &req));
    wait(req, "broadcast of", n, "bytes");
  }
  void barrier() override {
    MPI_Request req;
    GS_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
    wait(req, "barrier of", 0, "");
  }
  void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; if it did, end this rank anyway
  }

 private:
  static int count(std::size_t n) {
    GS_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()), "MPI collective of " << n << " values");
    return static_cast<int>(n);
  }

  // MPI_Test until the request completes. A non-blocking collective progresses only inside MPI calls,
  // so for the first second it is tested back to back (yielding the core between tests, for a rank
  // that shares it); after that a rank waits for a stuck peer, and sleeps 1 ms between tests.
  void wait(MPI_Request& req, const char* what, std::size_t n, const char* unit) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      GS_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_) {
        std::ostringstream msg;
        msg << "rank " << rank_ << " of " << size_ << ": the " << what << " " << n << " " << unit
            << " did not complete within " << timeout_ << " s: another rank died, hangs, or runs another "
            << "config (--dist-timeout sets the limit)";
        throw DistributedError(msg.str());
      }
      if (waited < 1.0)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  double timeout_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool owns_ = false;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(var)) return true;
  return false;
}

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_seconds) {
  GS_CHECK_CONFIG(timeout_seconds > 0, "the collective timeout must be > 0 seconds, got " << timeout_seconds);
  return std::make_unique<MpiCommunicator>(timeout_seconds);
}

}  // namespace gradscale
