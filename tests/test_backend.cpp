// The device seam on the host (lib/backend, lib/tensor): backends by name and their refusals, the
// `device` config key and `--device`, host tensors' copies, and a model on the CPU backend. The GPU side
// of the seam is tested in test_cuda_backend.cpp.
#include <catch2/catch.hpp>

#include <string>

#include "lib/backend/backend.h"
#include "lib/model/spec.h"
#include "lib/train/config.h"
#include "tests/cli_run.h"

using namespace gradscale;

TEST_CASE("backends by name: cpu, cuda, cuda:N, and a clear refusal of anything else", "[backend]") {
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->device() == Device::cpu);
  CHECK(cpu->memory() == nullptr);
  CHECK(cpu->optimizer_kernels() == nullptr);
  CHECK(cpu->description().rfind("cpu (", 0) == 0);
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""})
    CHECK_THROWS_WITH(make_backend(bad), Catch::Contains("unknown device") && Catch::Contains("cpu, cuda, cuda:N"));
  // "cuda" is refused with the reason on a machine without the CUDA backend or without a GPU.
  try {
    const std::unique_ptr<Backend> gpu = make_backend("cuda");
    CHECK(gpu->device() == Device::cuda);
  } catch (const ConfigError& e) {
    CHECK(!cuda_backend_built());
    CHECK_THAT(e.what(), Catch::Contains("no CUDA backend"));
  } catch (const CudaError& e) {
    CHECK(cuda_backend_built());
    CHECK_THAT(e.what(), Catch::Contains("no CUDA device"));
  }
}

TEST_CASE("the device config key and --device are checked", "[backend][config]") {
  TrainConfig c;
  CHECK(c.device == "cpu");
  c.merge_json({{"device", "cuda:1"}});
  CHECK(c.device == "cuda:1");
  CHECK(c.to_json().at("device") == "cuda:1");
  CHECK_THROWS_WITH(c.merge_json({{"device", "gpu"}}), Catch::Contains("config key 'device'"));
  CHECK_THROWS_WITH(c.merge_json({{"device", 3}}), Catch::Contains("device"));
  const test::CliResult r = test::run_cli("train --device tpu --data synthetic:64 --max-steps 1");
  CHECK(r.status == 2);
  std::string out;
  for (const std::string& line : r.lines) out += line + "\n";
  CHECK_THAT(out, Catch::Contains("device") && Catch::Contains("tpu"));
}

TEST_CASE("host tensors: copies keep the host, copy_from takes shape and values", "[backend][tensor]") {
  Tensor a({2, 3}, 1.5f);
  CHECK(a.device() == Device::cpu);
  CHECK(a.on_host());
  Tensor b(static_cast<DeviceMemory*>(nullptr));
  b.copy_from(a);
  CHECK(b.shape() == a.shape());
  CHECK(b[5] == 1.5f);
  const Tensor c = a.to_host();
  CHECK(c.on_host());
  CHECK(c[0] == 1.5f);
  a[0] = 2.0f;
  CHECK(c[0] == 1.5f);  // a copy, not a view
  Tensor moved = std::move(a);
  CHECK(moved[0] == 2.0f);
  CHECK(moved.size() == 6);
}

TEST_CASE("a model runs on the CPU backend until it is moved", "[backend][model]") {
  Rng rng(1);
  const std::unique_ptr<Model> m = build_model(builtin_model_spec("mlp"), rng);
  CHECK(m->device() == Device::cpu);
  CHECK(&m->backend() == &cpu_backend());
  m->use_backend(cpu_backend());  // already there: nothing changes
  CHECK(m->device() == Device::cpu);
  const std::unique_ptr<Backend> other = make_backend("cpu");
  m->use_backend(*other);  // another host backend: the same layers
  CHECK(&m->backend() == other.get());
  CHECK(m->layer(0).kind() == "flatten");  // the same host layers
  CHECK(m->device() == Device::cpu);
}
