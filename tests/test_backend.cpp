// The device seam on the host (lib/backend, lib/tensor): backends by name and their refusals, the
// `device` config key and `--device`, host tensors' copies, a model on the CPU backend, and the placement
// a model hands a backend (which GEMM operands the graph guarantees in F). The GPU side of the seam is
// tested in test_cuda_backend.cpp.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "lib/backend/backend.h"
#include "lib/layers/linear.h"
#include "lib/model/model.h"
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

TEST_CASE("the conv_algorithm config key and --conv-algorithm are checked, and the CPU has im2col only",
          "[backend][config]") {
  TrainConfig c;
  CHECK(c.conv_algorithm == "im2col");
  c.merge_json({{"conv_algorithm", "implicit"}});
  CHECK(c.conv_algorithm == "implicit");
  CHECK(c.to_json().at("conv_algorithm") == "implicit");
  CHECK_THROWS_WITH(c.merge_json({{"conv_algorithm", "winograd"}}),
                    Catch::Contains("config key 'conv_algorithm'") && Catch::Contains("winograd"));
  CHECK_THROWS_WITH(c.merge_json({{"conv_algorithm", 1}}), Catch::Contains("conv_algorithm"));
  cpu_backend().set_conv_algorithm("im2col");
  CHECK_THROWS_WITH(cpu_backend().set_conv_algorithm("implicit"),
                    Catch::Contains("conv_algorithm 'implicit'") && Catch::Contains("cuda"));
  // On the command line: a bad name, and implicit on the CPU, each exit 2 naming it.
  for (const char* args : {"train --conv-algorithm winograd --data synthetic:64 --max-steps 1",
                           "train --model cnn --conv-algorithm implicit --data synthetic:64 --max-steps 1"}) {
    INFO(args);
    const test::CliResult r = test::run_cli(args);
    CHECK(r.status == 2);
    std::string out;
    for (const std::string& line : r.lines) out += line + "\n";
    CHECK_THAT(out, Catch::Contains("conv_algorithm"));
  }
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

TEST_CASE("the placement a model hands its backend: which operands the graph guarantees in F", "[backend][model]") {
  Rng rng(1);
  const auto placements = [&](const std::string& name) {
    const std::unique_ptr<Model> m = build_model(builtin_model_spec(name), rng);
    std::map<std::string, LayerPlacement> by_name;
    const std::vector<LayerPlacement> p = m->placement();
    REQUIRE(p.size() == static_cast<std::size_t>(m->num_layers()));
    for (int i = 0; i < m->num_layers(); ++i) by_name[m->layer(i).name()] = p[static_cast<std::size_t>(i)];
    return by_name;
  };
  // mlp: flatten copies the model input (fp32 data), so fc1 reads an input not in F; relu1 passes fc1's
  // rounded output on. Every output gradient is rounded somewhere downstream (the loss, a Linear).
  auto mlp = placements("mlp");
  CHECK_FALSE(mlp["flatten"].inputs_in_format);
  CHECK_FALSE(mlp["fc1"].inputs_in_format);
  CHECK(mlp["relu1"].inputs_in_format);
  CHECK(mlp["fc2"].inputs_in_format);
  CHECK(mlp["fc3"].inputs_in_format);
  for (const char* name : {"flatten", "fc1", "relu1", "fc2", "relu2", "fc3"}) {
    INFO(name);
    CHECK(mlp[name].output_grad_in_format);
  }
  // resnet-mini: the stem conv reads the model input; a block's convolutions read rounded values; the
  // stem's relu forks (a join rounds its gradient); the adds pass their gradient on.
  auto resnet = placements("resnet-mini");
  CHECK_FALSE(resnet["stem.conv"].inputs_in_format);
  CHECK(resnet["stem.bn"].inputs_in_format);
  CHECK(resnet["s1.b1.conv1"].inputs_in_format);
  CHECK(resnet["s2.b1.proj"].inputs_in_format);
  CHECK(resnet["fc"].inputs_in_format);
  CHECK(resnet["s1.b1.bn2"].output_grad_in_format);
  CHECK(resnet["stem.relu"].output_grad_in_format);
  CHECK(resnet["pool"].output_grad_in_format);
}

namespace {

// A layer the library does not know: nothing is guaranteed about its output or its input gradient.
class Opaque final : public Layer {
 public:
  using Layer::Layer;
  std::string kind() const override { return "opaque"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override { return inputs[0]; }
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) override {
    output.copy_from(*inputs[0]);
  }
  void backward(const std::vector<const Tensor*>&, const Tensor&, const ScaledGrad& g,
                const std::vector<ScaledGrad*>& gi, BackwardContext&) override {
    if (gi[0]) *gi[0] = g;
  }
};

}  // namespace

TEST_CASE("the placement is conservative around a layer the library does not know", "[backend][model]") {
  Rng rng(2);
  Model m;
  const int fc1 = m.add(std::make_unique<Linear>("fc1", 4, 6, true, InitSpec{}, rng), {Model::kModelInput});
  const int opaque = m.add(std::make_unique<Opaque>("opaque"), {fc1});
  const int fc2 = m.add(std::make_unique<Linear>("fc2", 6, 3, true, InitSpec{}, rng), {opaque});
  m.finalize({4});
  const std::vector<LayerPlacement> p = m.placement();
  CHECK_FALSE(p[static_cast<std::size_t>(fc1)].inputs_in_format);       // the model input
  CHECK(p[static_cast<std::size_t>(opaque)].inputs_in_format);          // fc1 rounds its output
  CHECK_FALSE(p[static_cast<std::size_t>(fc2)].inputs_in_format);       // unknown output
  CHECK(p[static_cast<std::size_t>(fc2)].output_grad_in_format);        // the loss gradient
  CHECK(p[static_cast<std::size_t>(opaque)].output_grad_in_format);     // fc2 rounds its input gradient
  CHECK_FALSE(p[static_cast<std::size_t>(fc1)].output_grad_in_format);  // unknown input gradient
}
