// Collectives over a GPU's memory (see collectives.h).
#include "lib/cuda/collectives.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "lib/cuda/device_buffer.h"

#ifdef GRADSCALE_HAS_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace gradscale::cuda {
namespace {

// Through the host: device → page-locked host (one wait), the communicator's sum, host → device.
class HostCollectives final : public DeviceCollectives {
 public:
  HostCollectives(CudaContext& ctx, Communicator& comm) : ctx_(ctx), comm_(comm) {}
  std::string backend() const override { return "host (" + comm_.backend() + ")"; }
  void all_reduce_sum(float* device_data, std::size_t n) override {
    if (n == 0) return;
    // The previous call's copy back may still read the staging buffer: a larger one replaces it only
    // after a wait; otherwise this call's copy out is queued after that copy back, and waited for.
    if (staging_.size() < n) {
      ctx_.synchronize();
      staging_ = PinnedBuffer<float>(n);
    }
    GS_CUDA_CHECK(cudaMemcpyAsync(staging_.data(), device_data, n * sizeof(float), cudaMemcpyDeviceToHost,
                                  ctx_.stream()));
    ctx_.synchronize();
    comm_.all_reduce_sum(staging_.data(), n);
    GS_CUDA_CHECK(cudaMemcpyAsync(device_data, staging_.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                                  ctx_.stream()));
  }

 private:
  CudaContext& ctx_;
  Communicator& comm_;
  PinnedBuffer<float> staging_;
};

#ifdef GRADSCALE_HAS_NCCL

// The NCCL entries gradscale calls, from the library loaded at run time.
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;  // NCCL 2.14 and later
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  int version = 0;
};

// Not named bind: with a std::string argument, an unqualified bind(...) call finds std::bind by
// argument-dependent lookup, which matches better and silently binds nothing.
template <class F>
void bind_symbol(void* lib, const char* name, F& f, const std::string& path) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  GS_CHECK_CONFIG(f != nullptr, "NCCL library '" << path << "' has no " << name);
}

// The library GRADSCALE_NCCL_LIBRARY names, else libnccl.so.2 on the loader's path, else CMake's.
// Loaded once per process and choice; ConfigError (every time) when it cannot be.
const NcclApi& nccl_api() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("GRADSCALE_NCCL_LIBRARY"); env && *env) {
    candidates.push_back(env);
  } else {
    candidates.push_back("libnccl.so.2");
#ifdef GRADSCALE_NCCL_LIBRARY_PATH
    candidates.push_back(GRADSCALE_NCCL_LIBRARY_PATH);
#endif
  }
  static std::mutex mutex;
  static std::map<std::string, NcclApi> loaded;  // by the first candidate
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = loaded.find(candidates[0]); it != loaded.end()) return it->second;
  const NcclApi api = [&candidates] {
    void* lib = nullptr;
    std::string path, why;
    for (const std::string& c : candidates) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        path = c;
        break;
      }
      const char* e = dlerror();
      why += (why.empty() ? "" : "; ") + std::string(e ? e : c + ": not loaded");
    }
    GS_CHECK_CONFIG(lib != nullptr, "--gpu-collectives nccl: cannot load NCCL (" << why
                                        << "); set GRADSCALE_NCCL_LIBRARY to libnccl.so.2's path, or use "
                                        << "--gpu-collectives host");
    NcclApi a;
    bind_symbol(lib, "ncclGetVersion", a.get_version, path);
    bind_symbol(lib, "ncclGetUniqueId", a.get_unique_id, path);
    bind_symbol(lib, "ncclCommInitRankConfig", a.comm_init_rank_config, path);
    bind_symbol(lib, "ncclAllReduce", a.all_reduce, path);
    bind_symbol(lib, "ncclCommDestroy", a.comm_destroy, path);
    bind_symbol(lib, "ncclCommAbort", a.comm_abort, path);
    bind_symbol(lib, "ncclCommGetAsyncError", a.comm_get_async_error, path);
    bind_symbol(lib, "ncclGetErrorString", a.get_error_string, path);
    GS_CHECK_CONFIG(a.get_version(&a.version) == ncclSuccess, "NCCL library '" << path << "': ncclGetVersion failed");
    return a;  // the library stays loaded for the process
  }();
  return loaded.emplace(candidates[0], api).first->second;  // std::map: the reference stays valid
}

// A nonblocking NCCL communicator (config.blocking = 0): its start and any call may return
// ncclInProgress, and the next call waits until its state (ncclCommGetAsyncError) leaves that. The
// waits are polled here with the host communicator's deadline, so a rank that dies before or during
// NCCL's start ends the others with DistributedError, as a collective does.
class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(CudaContext& ctx, Communicator& comm) : api_(nccl_api()), ctx_(ctx), comm_(comm) {
    ncclUniqueId id{};
    if (comm.rank() == 0) check(api_.get_unique_id(&id), "ncclGetUniqueId");
    comm.broadcast(&id, sizeof id, 0);  // over the host communicator, with its deadline
    GS_CUDA_CHECK(cudaSetDevice(ctx.device()));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started = api_.comm_init_rank_config(&nccl_, comm.size(), id, comm.rank(), &config);
    if (started != ncclInProgress) check(started, "ncclCommInitRankConfig");
    wait_ready("ncclCommInitRankConfig (NCCL's start)");
    ctx_.set_wait_watch([this](double waited) { watch(waited); });
  }
  ~NcclCollectives() override {
    ctx_.set_wait_watch({});
    if (nccl_) api_.comm_destroy(nccl_);
  }
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  std::string backend() const override {
    const int v = api_.version;  // 22809: 2.28.9
    return "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
  void all_reduce_sum(float* device_data, std::size_t n) override {
    GS_CHECK_AS(DistributedError, nccl_ != nullptr, "NCCL's communicator was aborted after an earlier error");
    if (n == 0) return;
    const ncclResult_t r =
        api_.all_reduce(device_data, device_data, n, ncclFloat32, ncclSum, nccl_, ctx_.stream());
    if (r == ncclInProgress)
      wait_ready("ncclAllReduce");
    else
      check(r, "ncclAllReduce");
  }

 private:
  // Throws DistributedError for a call that failed; first aborts the communicator, if one was made.
  void check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return;
    std::ostringstream msg;
    msg << call << " failed: " << api_.get_error_string(r);
    if (r == ncclInvalidUsage) msg << " (one GPU per rank: NCCL refuses two ranks on one device; --gpu-collectives host shares one)";
    fail(msg.str());
  }
  [[noreturn]] void fail(const std::string& what) {
    if (nccl_) api_.comm_abort(nccl_);  // makes its kernels return, so the stream can drain
    nccl_ = nullptr;
    throw DistributedError("rank " + std::to_string(comm_.rank()) + " of " + std::to_string(comm_.size()) + ": " +
                           what);
  }
  std::string too_long(const std::string& what) const {
    std::ostringstream msg;
    msg << what << " did not complete within " << comm_.timeout_seconds()
        << " s: another rank died, hangs, or runs another config (--dist-timeout sets the limit)";
    return msg.str();
  }
  // Until the communicator's state leaves ncclInProgress after `call`: back to back for the first
  // millisecond, then every 100 µs; an error or the deadline ends it.
  void wait_ready(const char* call) {
    const auto start = std::chrono::steady_clock::now();
    const double limit = comm_.timeout_seconds();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(api_.comm_get_async_error(nccl_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(std::string(call) + " failed: " + api_.get_error_string(state));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (limit > 0 && waited > limit) fail(too_long(call));
      if (waited > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  // Between the polls of a wait for the device (CudaContext::synchronize).
  void watch(double waited) {
    if (!nccl_) return;
    ncclResult_t async = ncclSuccess;
    api_.comm_get_async_error(nccl_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      fail(std::string("NCCL reported an error: ") + api_.get_error_string(async));
    const double limit = comm_.timeout_seconds();
    if (limit > 0 && waited > limit) fail(too_long("a wait for the GPU (behind an NCCL all-reduce)"));
  }

  const NcclApi& api_;
  CudaContext& ctx_;
  Communicator& comm_;
  ncclComm_t nccl_ = nullptr;
};

#endif  // GRADSCALE_HAS_NCCL

}  // namespace

bool nccl_built() {
#ifdef GRADSCALE_HAS_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<DeviceCollectives> make_device_collectives(CudaContext& ctx, Communicator& comm,
                                                           const std::string& kind) {
  GS_CHECK_CONFIG(kind == "auto" || kind == "nccl" || kind == "host",
                  "unknown --gpu-collectives '" << kind << "' (allowed: auto, nccl, host)");
  const bool nccl = kind == "nccl" || (kind == "auto" && nccl_built());
#ifdef GRADSCALE_HAS_NCCL
  if (nccl) return std::make_unique<NcclCollectives>(ctx, comm);
#else
  GS_CHECK_CONFIG(!nccl, "--gpu-collectives nccl: this gradscale was built without NCCL (CMake found no "
                         "nccl.h); use --gpu-collectives host");
#endif
  return std::make_unique<HostCollectives>(ctx, comm);
}

}  // namespace gradscale::cuda
