// `gradscale bench`: throughput benchmarks that print figures (speed targets are checked here, never
// by timed assertions in tests). `bench numeric`: rounding and the histogram pass over 16M floats.
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "experiments/cli/command.h"
#include "experiments/cli/parse.h"
#include "lib/core/error.h"
#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"

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

// Gradient-like data: log-uniform magnitudes over 2^-40 .. 2^8, random signs, 5% zeros.
std::vector<float> gradient_like(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> log2mag(-40.0f, 8.0f);
  std::uniform_int_distribution<int> pct(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) {
    const int p = pct(rng);
    x = p < 5 ? 0.0f : std::exp2(log2mag(rng)) * (p % 2 ? 1.0f : -1.0f);
  }
  return v;
}

int bench_numeric(std::size_t n, int repeats) {
  const std::vector<float> in = gradient_like(n, 1);
  std::vector<float> out(n);
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
  return 0;
}

int run_bench(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string what;
  std::size_t n = std::size_t{1} << 24;
  int repeats = 5;
  desc.add_options()("what", po::value(&what)->required(), "benchmark: numeric")(
      "elements", po::value(&n), "number of floats (default 16M)")("repeats", po::value(&repeats),
                                                                   "runs per figure; the best is printed");
  po::positional_options_description pos;
  pos.add("what", 1);
  po::variables_map vm;
  if (!parse_options("gradscale bench numeric [--elements N] [--repeats R]", desc, args, vm, &pos)) return 0;
  GS_CHECK_CONFIG(repeats >= 1, "--repeats must be >= 1 (got " << repeats << ")");
  GS_CHECK_CONFIG(n >= 1, "--elements must be >= 1");
  if (what == "numeric") return bench_numeric(n, repeats);
  throw ConfigError("unknown benchmark '" + what + "' (allowed: numeric)");
}

}  // namespace

GS_REGISTER_COMMAND("bench", "benchmarks that print throughput figures", run_bench);

}  // namespace gradscale::cli
