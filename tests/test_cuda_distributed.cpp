// Data-parallel training on the CUDA backend (docs/distributed.md, "On GPUs"): two ranks — two threads
// of this process, each with its own CUDA context — take the decisions one process with the whole batch
// takes on the same backend, with the weight gradients summed on the device through the host; and the
// GPU collectives' choices and errors (lib/cuda/collectives.h). On the CPU execution target here; on a
// GPU as they are. The NCCL loader is tested against a stand-in library (tests/fake_nccl.cpp); the real
// NCCL case needs a GPU.
#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/cuda/backend.h"
#include "lib/cuda/collectives.h"
#include "lib/dist/data_parallel.h"
#include "lib/train/trainer.h"
#include "tests/cuda_test.h"
#include "tests/fake_nccl.h"
#include "tests/thread_ranks.h"

using namespace gradscale;
using Catch::Matchers::Contains;

namespace {

// GRADSCALE_NCCL_LIBRARY set for one scope, and put back as it was when the scope ends.
class NcclLibraryChoice {
 public:
  explicit NcclLibraryChoice(const char* path) : had_(std::getenv("GRADSCALE_NCCL_LIBRARY") != nullptr) {
    if (had_) saved_ = std::getenv("GRADSCALE_NCCL_LIBRARY");
    ::setenv("GRADSCALE_NCCL_LIBRARY", path, 1);
  }
  ~NcclLibraryChoice() {
    if (had_)
      ::setenv("GRADSCALE_NCCL_LIBRARY", saved_.c_str(), 1);
    else
      ::unsetenv("GRADSCALE_NCCL_LIBRARY");
  }
  NcclLibraryChoice(const NcclLibraryChoice&) = delete;
  NcclLibraryChoice& operator=(const NcclLibraryChoice&) = delete;

 private:
  bool had_;
  std::string saved_;
};

// The largest |a − b| over two runs' weights.
double max_weight_difference(const test::RankRecord& a, const test::RankRecord& b) {
  REQUIRE(a.weights.size() == b.weights.size());
  double d = 0;
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    REQUIRE(a.weights[i].size() == b.weights[i].size());
    for (std::size_t k = 0; k < a.weights[i].size(); ++k)
      d = std::max(d, static_cast<double>(std::fabs(a.weights[i][k] - b.weights[i][k])));
  }
  return d;
}

}  // namespace

TEST_CASE("cuda: two ranks (threads) take one process's decisions, the gradients summed on the device",
          "[cuda][dist]") {
  test::require_cuda_device();
  // S0 from the loss gradient and a controller that reads the upstream product's statistics; one that
  // reads the moments of g and W.
  const nlohmann::json scaler = GENERATE(
      nlohmann::json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}},
      nlohmann::json{{"policy", "adaptive"}, {"method", "approx_range"}});
  INFO("scaler " << scaler.dump());
  cuda::CudaBackend one_gpu(0);
  const test::RankRecord one = test::train_residual(nullptr, scaler, &one_gpu);
  test::RankRecord ranks[2], cpu_ranks[2];
  test::on_two_ranks([&](int r, Communicator& comm) {
    cuda::CudaBackend gpu(0);  // each rank its own context (on a machine with one GPU, the same device)
    ranks[r] = test::train_residual(&comm, scaler, &gpu, "host");
  });
  test::on_two_ranks([&](int r, Communicator& comm) { cpu_ranks[r] = test::train_residual(&comm, scaler, nullptr); });
  int scaled = 0;
  for (const test::RankRecord& rec : ranks) {
    // One process decides on the device (its controller's rule, the join's target there); two ranks on
    // the host from the reduced statistics: the same decisions.
    CHECK(rec.s0 == one.s0);
    CHECK(rec.skipped == one.skipped);
    CHECK(rec.scales == one.scales);
    // The weight gradients differ in their last fp32 bits before rounding (summed over two ranks, not
    // one GEMM over the batch), so a rounding to fp8 may land one step apart: Adam moves such a weight
    // by at most about lr per step more or less (as the CPU's case, tests/test_distributed_threads.cpp).
    const double d = max_weight_difference(rec, one);
    INFO("max |w_rank - w_one| = " << d);
    CHECK(d <= 2 * 1e-3 * test::kResidualSteps);
  }
  CHECK(ranks[0].weights == ranks[1].weights);  // the ranks agree bit for bit
  // The CPU engine's two ranks reduce the same statistics the same way: the same decisions.
  CHECK(ranks[0].s0 == cpu_ranks[0].s0);
  CHECK(ranks[0].scales == cpu_ranks[0].scales);
  for (const auto& step : one.scales)
    for (double s : step) scaled += s != 1.0;
  CHECK(scaled > 0);  // the controller scaled some layer: equal decisions are not trivially 1
}

TEST_CASE("cuda: the GPU collectives refuse an unknown kind, and name what NCCL lacks", "[cuda][dist]") {
  test::require_cuda_device();
  cuda::CudaContext ctx(0);
  LocalCommunicator local;
  CHECK_THROWS_AS(cuda::make_device_collectives(ctx, local, "gloo"), ConfigError);
  CHECK_THROWS_WITH(cuda::make_device_collectives(ctx, local, "gloo"), Contains("unknown --gpu-collectives 'gloo'"));
  // "host" over one rank: the values stay.
  const auto host = cuda::make_device_collectives(ctx, local, "host");
  CHECK(host->backend() == "host (local)");
  auto d = test::to_device(std::vector<float>{1.5f, -2.0f, 3.0f}, ctx);
  host->all_reduce_sum(d.data(), 3);
  CHECK(test::to_host(d, ctx) == std::vector<float>{1.5f, -2.0f, 3.0f});
  if (!cuda::nccl_built()) {
    CHECK_THROWS_WITH(cuda::make_device_collectives(ctx, local, "nccl"), Contains("built without NCCL"));
    CHECK(cuda::make_device_collectives(ctx, local, "auto")->backend() == "host (local)");
    return;
  }
  // A library that is not there: the error names it and the way out.
  const NcclLibraryChoice missing("/nonexistent/libnccl.so.2");
  try {
    cuda::make_device_collectives(ctx, local, "nccl");
    FAIL("NCCL was loaded from a path that does not exist");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("cannot load NCCL") && Contains("/nonexistent/libnccl.so.2") &&
                             Contains("--gpu-collectives host"));
  }
}

#ifdef GRADSCALE_FAKE_NCCL
namespace {

// The stand-in NCCL library's state, through its own entry. The library stays loaded, so the loader's
// dlopen of the same path later gets this copy.
test::FakeNccl& fake_nccl() {
  static void* const lib = dlopen(GRADSCALE_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  const auto entry = reinterpret_cast<test::FakeNccl* (*)()>(dlsym(lib, "fake_nccl"));
  REQUIRE(entry != nullptr);
  return *entry();
}

// One process whose waits for other ranks give up after `seconds` (LocalCommunicator's never do).
class LocalWithDeadline final : public Communicator {
 public:
  explicit LocalWithDeadline(double seconds) : seconds_(seconds) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  double timeout_seconds() const override { return seconds_; }
  void all_reduce_sum(std::uint64_t*, std::size_t) override {}
  void all_reduce_sum(float*, std::size_t) override {}
  void all_reduce_max(double*, std::size_t) override {}
  void all_gather(const double* in, std::size_t n, double* out) override { local_.all_gather(in, n, out); }
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { local_.abort(code); }

 private:
  double seconds_;
  LocalCommunicator local_;
};

}  // namespace

TEST_CASE("cuda: the NCCL loader binds every entry it calls, and names one a library lacks", "[cuda][dist]") {
  test::require_cuda_device();
  test::FakeNccl& fake = fake_nccl();
  fake = {};
  cuda::CudaContext ctx(0);
  LocalCommunicator local;
  {
    const NcclLibraryChoice partial(GRADSCALE_FAKE_NCCL_PARTIAL);
    CHECK_THROWS_AS(cuda::make_device_collectives(ctx, local, "nccl"), ConfigError);
    CHECK_THROWS_WITH(cuda::make_device_collectives(ctx, local, "nccl"),
                      Contains(GRADSCALE_FAKE_NCCL_PARTIAL) && Contains("has no ncclCommGetAsyncError"));
  }
  // The whole stand-in: every call reaches it (a loader that bound nothing would call a null pointer).
  const NcclLibraryChoice whole(GRADSCALE_FAKE_NCCL);
  {
    const auto nccl = cuda::make_device_collectives(ctx, local, "auto");  // auto: NCCL in a build with it
    CHECK(nccl->backend() == "nccl 2.28.99");
  }
  CHECK(fake.comms_started == 1);  // nonblocking, with rank 0's unique id
  CHECK(fake.comms_destroyed == 1);
  {
    const auto nccl = cuda::make_device_collectives(ctx, local, "nccl");
    auto d = test::to_device(std::vector<float>{1.5f, -2.0f, 3.0f}, ctx);
    nccl->all_reduce_sum(d.data(), 3);
    nccl->all_reduce_sum(d.data(), 0);  // nothing to sum: no call
    ctx.synchronize();  // polled through the NCCL watch: no error to report
    CHECK(test::to_host(d, ctx) == std::vector<float>{1.5f, -2.0f, 3.0f});
    CHECK(fake.all_reduces == 1);  // a float sum in place: the stand-in refuses anything else
    CHECK(fake.last_count == 3);
    CHECK(fake.last_stream == static_cast<const void*>(ctx.stream()));
  }
  CHECK(fake.comms_started == 2);
  CHECK(fake.comms_destroyed == 2);
  CHECK(fake.comms_aborted == 0);
}

TEST_CASE("cuda: NCCL's start and calls in progress are waited for, up to the deadline, and errors end them",
          "[cuda][dist]") {
  test::require_cuda_device();
  test::FakeNccl& fake = fake_nccl();
  fake = {};
  const NcclLibraryChoice whole(GRADSCALE_FAKE_NCCL);
  cuda::CudaContext ctx(0);
  LocalWithDeadline comm(0.2);
  auto d = test::to_device(std::vector<float>{1.5f, -2.0f, 3.0f}, ctx);
  // A start in progress for 5 polls and an all-reduce for 3: each waited for, then used.
  fake.start_polls = 5;
  fake.all_reduce_polls = 3;
  {
    const auto nccl = cuda::make_device_collectives(ctx, comm, "nccl");
    CHECK(fake.state_polls == 6);  // 5 in progress, then ready
    nccl->all_reduce_sum(d.data(), 3);
    CHECK(fake.state_polls == 10);
    CHECK(fake.all_reduces == 1);
  }
  CHECK(fake.comms_destroyed == 1);
  // A start that never ends (another rank died before NCCL's start): given up at the deadline.
  fake.start_polls = -1;
  const auto start = std::chrono::steady_clock::now();
  try {
    cuda::make_device_collectives(ctx, comm, "nccl");
    FAIL("a start in progress for ever returned");
  } catch (const DistributedError& e) {
    CHECK_THAT(e.what(), Contains("rank 0 of 1: ncclCommInitRankConfig (NCCL's start) did not complete within 0.2 s") &&
                             Contains("--dist-timeout"));
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= 0.2);
  CHECK(fake.comms_aborted == 1);
  // A start whose progress ends in an error: the error, named.
  fake.start_polls = 2;
  fake.progress_fails = true;
  CHECK_THROWS_WITH(cuda::make_device_collectives(ctx, comm, "nccl"),
                    Contains("ncclCommInitRankConfig (NCCL's start) failed: an error (fake)"));
  CHECK(fake.comms_aborted == 2);
  // An all-reduce whose progress ends in an error: named, the communicator aborted, the next refused.
  fake.start_polls = 0;
  fake.progress_fails = false;
  const auto nccl = cuda::make_device_collectives(ctx, comm, "nccl");
  fake.all_reduce_polls = 2;
  fake.progress_fails = true;
  CHECK_THROWS_AS(nccl->all_reduce_sum(d.data(), 3), DistributedError);
  CHECK(fake.comms_aborted == 3);
  CHECK_THROWS_WITH(nccl->all_reduce_sum(d.data(), 3), Contains("aborted after an earlier error"));
  CHECK(fake.all_reduces == 2);  // the refused call did not reach NCCL
}
#endif

TEST_CASE("cuda: NCCL over one rank on a GPU sums in place and says its version", "[cuda][dist]") {
  test::require_cuda_device();
  test::require_gpu_hardware("NCCL runs its kernels on a real GPU");
  if (!cuda::nccl_built()) test::skip_test("this gradscale was built without NCCL (CMake found no nccl.h)");
  cuda::CudaContext ctx(0);
  LocalCommunicator local;
  const auto nccl = cuda::make_device_collectives(ctx, local, "nccl");
  INFO(nccl->backend());
  CHECK(nccl->backend().rfind("nccl 2.", 0) == 0);
  auto d = test::to_device(std::vector<float>{1.5f, -2.0f, 3.0f}, ctx);
  nccl->all_reduce_sum(d.data(), 3);
  ctx.synchronize();  // through the context's watch (polled)
  CHECK(test::to_host(d, ctx) == std::vector<float>{1.5f, -2.0f, 3.0f});
}

TEST_CASE("cuda: the Trainer on two ranks (threads) with device cuda ends where one process ends", "[cuda][dist]") {
  test::require_cuda_device();
  TrainConfig c;
  c.model = "deep-mlp:depth=4,width=32,gain=0.5";
  c.data = "synthetic:512";
  c.format = Format::fp8_e5m2;
  c.batch = 64;
  c.max_steps = 6;
  c.threads = 1;
  c.device = "cuda";  // each rank: device (local rank mod devices), here the one device
  c.scaler = {{"policy", "adaptive"}, {"method", "measured"}};
  const auto weights_of = [](Trainer& t) {
    std::vector<std::vector<float>> w;
    for (const Parameter* p : t.model().parameters()) {
      const Tensor h = p->value.to_host();
      w.emplace_back(h.data(), h.data() + h.size());
    }
    return w;
  };
  Trainer one(c);
  const nlohmann::json r1 = one.run();
  const auto w1 = weights_of(one);
  nlohmann::json r2[2];
  std::vector<std::vector<float>> w2[2];
  test::on_two_ranks([&](int r, Communicator& comm) {
    Trainer t(c, nullptr, &comm, "host");  // the end-of-run weight check compares the GPUs' weights
    r2[r] = t.run();
    w2[r] = weights_of(t);
  });
  REQUIRE(r2[0]["ranks"] == 2);
  CHECK(r2[0]["data_parallel"]["gpu_collectives"] == "host (threads)");
  CHECK(r2[0]["data_parallel"]["gradient_collectives"].get<int>() > 0);
  CHECK(r2[0]["steps"] == r1["steps"]);
  CHECK(r2[0]["skipped_steps"] == r1["skipped_steps"]);
  CHECK(r2[0]["final_scale"] == r1["final_scale"]);
  CHECK(r2[0]["scaler_state"] == r1["scaler_state"]);  // the controller's per-layer state included
  CHECK(w2[0] == w2[1]);
  INFO("scaler_state " << r1["scaler_state"].dump());
  double d = 0;
  for (std::size_t i = 0; i < w1.size(); ++i)
    for (std::size_t k = 0; k < w1[i].size(); ++k) d = std::max(d, static_cast<double>(std::fabs(w1[i][k] - w2[0][i][k])));
  INFO("max |w_two - w_one| = " << d);
  CHECK(d <= 2 * c.lr * static_cast<double>(c.max_steps));
}
