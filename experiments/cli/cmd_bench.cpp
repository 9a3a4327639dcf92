// `gradscale bench`: throughput benchmarks that print figures (speed targets are checked here, never
// by timed assertions in tests). `bench numeric`: rounding and the histogram pass over 16M floats.
// `bench step`: the training step of a model, layer by layer. `bench cuda`: the GPU kernels' bandwidth
// (bench_cuda.cpp, in CUDA builds only).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "experiments/cli/bench_cuda.h"
#include "experiments/cli/bench_data.h"
#include "experiments/cli/command.h"
#include "experiments/cli/parse.h"
#include "experiments/cli/train_options.h"
#include "lib/core/error.h"
#include "lib/data/batcher.h"
#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"
#include "lib/train/trainer.h"

namespace gradscale::cli {
namespace {

// Best of `repeats` runs, in elements per second.
double best_rate(std::size_t n, int repeats, const std::function<void()>& fn) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) / s);
  }
  return best;
}

int bench_numeric(std::size_t n, int repeats) {
  std::vector<float> in, out;
  try {
    in = gradient_like(n, 1);
    out.resize(n);
  } catch (const std::bad_alloc&) {
    throw ConfigError("--elements " + std::to_string(n) + ": out of memory for two buffers of " +
                      std::to_string(n) + " floats; give fewer");
  }
  std::printf("gradscale bench numeric: %zu floats, best of %d, one thread\n", n, repeats);
  std::printf("%-28s %12s\n", "operation", "G elem/s");
  auto row = [&](const std::string& name, const std::function<void()>& fn) {
    std::printf("%-28s %12.3f\n", name.c_str(), best_rate(n, repeats, fn) / 1e9);
    std::fflush(stdout);
  };
  for (Fp16Path p : {Fp16Path::avx512, Fp16Path::f16c, Fp16Path::portable}) {
    if (!fp16_path_available(p)) {
      std::printf("%-28s %12s\n", (std::string("fp16 quantize (") + fp16_path_name(p) + ")").c_str(), "n/a");
      continue;
    }
    row(std::string("fp16 quantize (") + fp16_path_name(p) + ")",
        [&] { quantize_fp16(in.data(), out.data(), n, p); });
  }
  row("bf16 quantize", [&] { quantize(in.data(), out.data(), n, Format::bf16); });
  row("fp8_e5m2 quantize", [&] { quantize(in.data(), out.data(), n, Format::fp8_e5m2); });
  row("fp8_e4m3 quantize", [&] { quantize(in.data(), out.data(), n, Format::fp8_e4m3); });
  volatile std::uint64_t sink = 0;
  row("histogram pass (fp16)", [&] { sink = sink + tensor_stats(in.data(), n, Format::fp16).underflow; });
  // What a call costs beyond its values: the plug-in rounds many small tensors (a bias, a layer's
  // gradient at batch 8), one call each.
  constexpr std::size_t kCalls = 100000, kSmall = 8;
  std::printf("%-28s %12s\n", "per call, 8 floats", "ns");
  for (Format f : {Format::fp16, Format::bf16, Format::fp8_e4m3}) {
    const double calls_per_s = best_rate(kCalls, repeats, [&] {
      for (std::size_t c = 0; c < kCalls; ++c) quantize(in.data(), out.data(), std::min(kSmall, n), f);
    });
    std::printf("%-28s %12.1f\n", (format_name(f) + std::string(" quantize")).c_str(), 1e9 / calls_per_s);
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Times `steps` training steps (after `warmup` untimed ones) on the training data of `config`, one
// mini-batch after another, and prints per-layer forward and backward milliseconds per step, the rest
// of the step (working weights, loss, scaler, optimizer), the device time in GEMMs and the host's waits
// for the device where the backend has them (cuda), and the step time with its epoch projection. On a
// device the per-layer times need a wait after every layer, which would slow the step it times: they
// come from a second pass of `steps` steps, and the step time from the first, unprofiled one.
int bench_step(TrainConfig config, std::int64_t steps, std::int64_t warmup) {
  Trainer trainer(config, &std::cerr);  // prints which data it uses
  Batcher batches(trainer.data().train, config.batch, config.seed);
  Tensor x;
  std::vector<std::int32_t> y;
  auto next_batch = [&] {
    if (!batches.next(x, y)) batches.next(x, y);
  };
  for (std::int64_t i = 0; i < warmup; ++i) {
    next_batch();
    trainer.train_step(x, y);
  }
  Model& model = trainer.model();
  Backend& backend = model.backend();
  const bool on_device = backend.device() != Device::cpu;
  std::int64_t skipped = 0, waits = 0;
  auto run_steps = [&](bool profile) {
    backend.synchronize();
    model.set_profiling(profile);
    std::vector<double> seconds;
    for (std::int64_t i = 0; i < steps; ++i) {
      next_batch();
      const auto t0 = std::chrono::steady_clock::now();
      const std::int64_t waits_before = backend.host_waits();
      skipped += trainer.train_step(x, y).skipped;
      waits += backend.host_waits() - waits_before;
      backend.synchronize();  // a device's step ends when its kernels have run
      seconds.push_back(seconds_since(t0));
    }
    return seconds;
  };
  backend.set_gemm_timing(true);
  (void)backend.gemm_seconds();  // start from here
  const double scaler_before = trainer.scaler_seconds();
  const std::vector<double> step_seconds = run_steps(!on_device);
  const double waits_per_step = static_cast<double>(waits) / static_cast<double>(steps);  // the timed pass's
  const double scaler_ms = 1e3 * (trainer.scaler_seconds() - scaler_before) / static_cast<double>(steps);
  const double gemm_s = backend.gemm_seconds();
  backend.set_gemm_timing(false);
  if (on_device) (void)run_steps(true);  // the layer table's pass
  const std::vector<Model::LayerTime> times = model.layer_times();
  model.set_profiling(false);

  const auto count = static_cast<double>(steps);
  double total = 0;
  for (double t : step_seconds) total += t;
  std::vector<double> sorted = step_seconds;
  std::sort(sorted.begin(), sorted.end());
  const double mean_ms = 1e3 * total / count, median_ms = 1e3 * sorted[sorted.size() / 2];
  std::printf(
      "gradscale bench step: model %s, %s, batch %lld, threads %d, %lld steps after %lld warm-up "
      "(%lld skipped)\n",
      config.model_spec.is_object() && !config.model_spec.empty() ? "(spec)" : config.model.c_str(),
      format_name(config.format), static_cast<long long>(config.batch), omp_get_max_threads(),
      static_cast<long long>(steps), static_cast<long long>(warmup), static_cast<long long>(skipped));
  std::printf("device: %s\n", backend.description().c_str());
  if (on_device)
    std::printf("(the layer times come from a second pass of %lld steps that waits for the device after every "
                "layer; the shares are of the unprofiled step)\n",
                static_cast<long long>(steps));
  std::printf("%-4s %-16s %-14s %12s %12s %8s\n", "id", "layer", "kind", "forward ms", "backward ms",
              "share");
  double layers_ms = 0;
  for (int i = 0; i < model.num_layers(); ++i) {
    const auto& t = times[static_cast<std::size_t>(i)];
    const double f = 1e3 * t.forward / count, b = 1e3 * t.backward / count;
    layers_ms += f + b;
    std::printf("%-4d %-16s %-14s %12.3f %12.3f %7.1f%%\n", i, model.layer(i).name().c_str(),
                model.layer(i).kind().c_str(), f, b, 100.0 * (f + b) / mean_ms);
  }
  std::printf("%-36s %25.3f %7.1f%%\n", "layers (forward + backward)", layers_ms,
              100.0 * layers_ms / mean_ms);
  if (!on_device)  // a device's profiled layers and its unprofiled step do not subtract
    std::printf("%-36s %25.3f %7.1f%%\n", "rest (weights, loss, scaler, optimizer)", mean_ms - layers_ms,
                100.0 * (mean_ms - layers_ms) / mean_ms);
  std::printf("%-36s %25.3f %7.1f%%   (policy %s: S0, controller, the statistics it asked for, update)\n",
              "of which in the scaler", scaler_ms, 100.0 * scaler_ms / mean_ms, trainer.scaler().policy().c_str());
  if (gemm_s >= 0) {
    const double gemm_ms = 1e3 * gemm_s / count;
    std::printf("%-36s %25.3f %7.1f%%   (device time of the matrix products, cuBLAS)\n", "of the step in GEMMs",
                gemm_ms, 100.0 * gemm_ms / mean_ms);
  }
  if (on_device)
    std::printf("host waits for the device per step: %.2f   (copies to the host and synchronisations)\n",
                waits_per_step);
  const double per_epoch = static_cast<double>(batches.batches_per_epoch());
  std::printf(
      "step: mean %.3f ms, median %.3f ms, %.1f steps/s; one epoch of %lld samples (%lld steps) "
      "takes about %.2f s\n",
      mean_ms, median_ms, 1e3 / mean_ms, static_cast<long long>(trainer.data().train.size()),
      static_cast<long long>(batches.batches_per_epoch()), per_epoch * mean_ms / 1e3);
  return 0;
}

// The CLI's one CUDA seam: bench_cuda.cpp is compiled only when the build has CUDA.
#ifdef GRADSCALE_HAS_CUDA
constexpr bool kCudaBuilt = true;
int run_bench_cuda(std::size_t n, int repeats) {
  return bench_cuda(n, repeats);
}
#else
constexpr bool kCudaBuilt = false;
int run_bench_cuda(std::size_t, int) {
  throw ConfigError(
      "bench cuda: this gradscale was built without CUDA (configure with -DGRADSCALE_CUDA=ON "
      "on a machine with nvcc; docs/gpu.md)");
}
#endif

// Bounds of the numeric options (docs/config.md): large enough for any figure worth taking,
// small enough that a slip of the keyboard is refused at once instead of allocating or running for days.
constexpr std::int64_t kMaxElements = std::int64_t{1} << 30;
constexpr std::int64_t kMaxRepeats = 1000;
constexpr std::int64_t kMaxSteps = 1000000;

int run_bench(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string what;
  desc.add_options()("what", po::value(&what)->required(), "benchmark: numeric | step | cuda")(
      "elements", po::value<std::string>(),
      "numeric, cuda: number of floats, at most 2^30 (default 16M; cuda: 64M)")(
      "repeats", po::value<std::string>()->default_value("5"),
      "numeric, cuda: runs per figure, at most 1000; the best is printed")(
      "steps", po::value<std::string>()->default_value("50"), "step: timed training steps, at most 1000000")(
      "warmup", po::value<std::string>()->default_value("5"), "step: untimed steps first, at most 1000000");
  po::options_description train(
      "step: the training run (the options of `gradscale train` but the whole-run ones; docs/config.md)");
  add_train_options(train);
  desc.add(train);
  po::positional_options_description pos;
  pos.add("what", 1);
  po::variables_map vm;
  const std::string usage = std::string(
                                "gradscale bench numeric [--elements N] [--repeats R]\n"
                                "       gradscale bench step [--steps N] [--warmup N] [train options]\n"
                                "       gradscale bench cuda [--elements N] [--repeats R]") +
                            (kCudaBuilt ? "   (GPU kernels next to a device copy; prints a line and exits 0 "
                                          "without a GPU)"
                                        : "   (not in this build: it has no CUDA)");
  if (!parse_options(usage, desc, args, vm, &pos)) return 0;
  auto count = [&](const char* option, std::int64_t lo, std::int64_t hi) {
    return parse_count(vm[option].as<std::string>(), (std::string("--") + option).c_str(), lo, hi);
  };
  const auto elements = [&](std::size_t fallback) {
    return vm.count("elements") ? static_cast<std::size_t>(count("elements", 1, kMaxElements)) : fallback;
  };
  const auto repeats = [&] { return static_cast<int>(count("repeats", 1, kMaxRepeats)); };
  if (what == "numeric") return bench_numeric(elements(std::size_t{1} << 24), repeats());
  if (what == "step") {
    // Options about a whole run have nothing to act on here; say so rather than ignore them.
    for (const char* flag :
         {"epochs", "max-steps", "eval-batch", "progress-seconds", "checkpoint", "save-every"})
      GS_CHECK_CONFIG(!vm.count(flag), "--" << flag
                                            << " does not apply to bench step (it times --steps steps "
                                               "after --warmup steps)");
    const std::int64_t steps = count("steps", 1, kMaxSteps), warmup = count("warmup", 0, kMaxSteps);
    return bench_step(train_config_from(vm), steps, warmup);
  }
  if (what == "cuda") return run_bench_cuda(elements(std::size_t{1} << 26), repeats());
  throw ConfigError("unknown benchmark '" + what + "' (allowed: numeric, step, cuda)");
}

}  // namespace

GS_REGISTER_COMMAND("bench", "benchmarks that print throughput figures", run_bench);

}  // namespace gradscale::cli
