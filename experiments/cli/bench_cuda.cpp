// `gradscale bench cuda` (see bench_cuda.h): GB/s of the SPEC §3 statistics pass, the rounding, the
// storage conversions and a convolution's column passes, next to cudaMemcpy device-to-device on the
// same data. The target is the statistics pass at >= 85% of the copy's bandwidth; the figures
// are printed, never asserted.
#include "experiments/cli/bench_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "experiments/cli/bench_data.h"
#include "lib/cuda/context.h"
#include "lib/cuda/conv_implicit.h"
#include "lib/cuda/convert.h"
#include "lib/cuda/device_buffer.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/stats.h"
#include "lib/cuda/unscale.h"
#include "lib/numeric/quantize.h"

namespace gradscale::cli {
namespace {

// A CUDA event, destroyed with its owner.
class Event {
 public:
  Event() { GS_CUDA_CHECK(cudaEventCreate(&e_)); }
  ~Event() { (void)cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Best of `repeats` runs of fn on ctx's stream, in milliseconds (one untimed warm-up run first).
double best_ms(cuda::CudaContext& ctx, int repeats, const std::function<void()>& fn) {
  Event start, stop;
  fn();
  ctx.synchronize();
  float best = 0;
  for (int r = 0; r < repeats; ++r) {
    GS_CUDA_CHECK(cudaEventRecord(start.get(), ctx.stream()));
    fn();
    GS_CUDA_CHECK(cudaEventRecord(stop.get(), ctx.stream()));
    GS_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    GS_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    best = r == 0 ? ms : std::min(best, ms);
  }
  return static_cast<double>(best);
}

// A convolution's forward pass at fp16 (CudaConv2d's two algorithms, conv_algorithm): im2col writing
// the 16-bit columns, the batched fp16 GEMM with fp32 accumulation, the output's rounding pass; against
// conv_forward_implicit's one kernel. resnet-mini's convolutions at batch 256, on values of fp16.
void bench_conv_forward(cuda::CudaContext& ctx, int repeats) {
  struct Conv {
    const char* name;
    std::int64_t c, hw, o, kernel, stride, pad;
  };
  const Conv convs[] = {{"stem 1->16 28x28 3x3", 1, 28, 16, 3, 1, 1},
                        {"stage 1 16->16 28x28 3x3", 16, 28, 16, 3, 1, 1},
                        {"stage 2 16->32 28x28 3x3 /2", 16, 28, 32, 3, 2, 1},
                        {"stage 2 32->32 14x14 3x3", 32, 14, 32, 3, 1, 1},
                        {"stage 3 64->64 7x7 3x3", 64, 7, 64, 3, 1, 1},
                        {"stage 3 proj 32->64 14x14 1x1 /2", 32, 14, 64, 1, 2, 0}};
  constexpr std::int64_t kBatch = 256;
  std::printf("\nconv forward, batch %lld, fp16 (ms)          im2col+GEMM+round   implicit   implicit/im2col\n",
              static_cast<long long>(kBatch));
  const cuda::DeviceRounding fp16 = cuda::device_rounding(Format::fp16);
  for (const Conv& v : convs) {
    const cuda::ConvGeometry g{kBatch, v.c, v.hw, v.hw, v.kernel, v.stride, v.pad};
    const std::int64_t rows = g.col_rows(), plane = g.col_cols();
    std::vector<float> hx = gradient_like(static_cast<std::size_t>(kBatch * v.c * v.hw * v.hw), 5);
    std::vector<float> hw = gradient_like(static_cast<std::size_t>(v.o * rows), 6);
    for (float& e : hx) e = quantize(e * 1e3f, Format::fp16);
    for (float& e : hw) e = quantize(e * 1e3f, Format::fp16);
    auto x = cuda::DeviceBuffer<float>::from_host(hx, ctx.stream());
    auto w = cuda::DeviceBuffer<float>::from_host(hw, ctx.stream());
    cuda::DeviceBuffer<__half> w16(hw.size());
    cuda::to_fp16(w.data(), w16.data(), hw.size(), ctx.stream());
    cuda::DeviceBuffer<std::uint16_t> cols16(static_cast<std::size_t>(kBatch * rows * plane));
    cuda::DeviceBuffer<float> y(static_cast<std::size_t>(kBatch * v.o * plane));
    const double gemm_ms = best_ms(ctx, repeats, [&] {
      cuda::im2col_16bit(x.data(), g, cols16.data(), cuda::DeviceType::f16, ctx.stream());
      cuda::gemm(ctx, v.o, plane, rows, 1.0f, {w16.data(), cuda::DeviceType::f16, false, 0},
                 {cols16.data(), cuda::DeviceType::f16, false, rows * plane}, 0.0f,
                 {y.data(), cuda::DeviceType::f32, v.o * plane}, kBatch);
      cuda::quantize(y.data(), y.data(), y.size(), Format::fp16, {}, 1.0f, ctx.stream());
    });
    const double implicit_ms = best_ms(ctx, repeats, [&] {
      cuda::conv_forward_implicit(x.data(), g, w.data(), v.o, nullptr, y.data(), fp16, ctx.stream());
    });
    std::printf("%-40s %18.3f %10.3f %17.2f\n", v.name, gemm_ms, implicit_ms, implicit_ms / gemm_ms);
    std::fflush(stdout);
  }
}

}  // namespace

int bench_cuda(std::size_t n, int repeats) {
  if (cuda::device_count() == 0) {
    std::printf("gradscale bench cuda: no CUDA device (%s): nothing to measure\n",
                cuda::no_device_reason().c_str());
    return 0;
  }
  cuda::CudaContext ctx;
  const std::vector<float> host = gradient_like(n, 1);
  auto in = cuda::DeviceBuffer<float>::from_host(host, ctx.stream());
  cuda::DeviceBuffer<float> out(n), master(n);
  master.fill_bytes(0, ctx.stream());
  cuda::DeviceBuffer<__half> half(n);
  cuda::DeviceBuffer<__nv_bfloat16> bf16(n);
  cuda::DeviceBuffer<cuda::DeviceStats> stats(1);
  cuda::DeviceBuffer<int> flag(1);
  flag.fill_bytes(0, ctx.stream());

  std::printf("gradscale bench cuda: %s, %zu floats (%.0f MiB), best of %d\n",
              cuda::device_description(ctx.device()).c_str(), n, static_cast<double>(n) * 4.0 / (1 << 20),
              repeats);
  std::printf("%-40s %10s %10s %10s\n", "operation", "ms", "GB/s", "of copy");
  const auto elements = static_cast<double>(n);
  double copy_gbs = 0;
  // `bytes`: what the operation must move at the least (each input read once, each output written once).
  auto row_bytes = [&](const std::string& name, double bytes, const std::function<void()>& fn_run) {
    const double ms = best_ms(ctx, repeats, fn_run);
    const double gbs = bytes / (ms * 1e6);
    if (copy_gbs == 0) copy_gbs = gbs;
    std::printf("%-40s %10.3f %10.1f %9.1f%%\n", name.c_str(), ms, gbs, 100.0 * gbs / copy_gbs);
    std::fflush(stdout);
  };
  auto row = [&](const std::string& name, double bytes_per_element, const std::function<void()>& fn_run) {
    row_bytes(name, bytes_per_element * elements, fn_run);
  };
  row("device-to-device copy (read + write)", 8, [&] {
    GS_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), in.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
  });
  for (Format f : {Format::fp16, Format::fp8_e5m2})
    row(std::string("tensor_stats ") + format_name(f) + " (read)", 4,
        [&] { cuda::tensor_stats(ctx, in.data(), n, f, {}, stats.data()); });
  // The histogram's atomics against the data's spread, the same pass over two other inputs: every value
  // in one binade ([1, 2): all 32 lanes of a warp count into one bin at once) and values spread over 241
  // binades. A pass held back by atomics on one address is slower on the first than on the second.
  {
    std::vector<float> values(n);
    std::mt19937 gen(3);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> binade(-120, 120);
    for (int spread = 0; spread < 2; ++spread) {
      for (float& v : values) v = spread ? std::ldexp(mantissa(gen), binade(gen)) : mantissa(gen);
      GS_CUDA_CHECK(cudaMemcpyAsync(out.data(), values.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                                    ctx.stream()));
      row(std::string("tensor_stats fp16, ") + (spread ? "241 binades" : "one binade") + " (read)", 4,
          [&] { cuda::tensor_stats(ctx, out.data(), n, Format::fp16, {}, stats.data()); });
    }
  }
  cuda::DeviceBuffer<unsigned> max_bits(1);
  row("max_abs_bits (read; the maximum alone)", 4, [&] { cuda::max_abs_bits(in.data(), n, max_bits.data(), ctx.stream()); });
  for (Format f : {Format::fp16, Format::bf16, Format::fp8_e5m2, Format::fp8_e4m3})
    row(std::string("quantize ") + format_name(f) + " (fp32 -> fp32)", 8,
        [&] { cuda::quantize(in.data(), out.data(), n, f, {}, 1.0f, ctx.stream()); });
  // A gradient's rounding with its local scale (the backend's round_gradient): the product, the
  // statistics and the rounding as three passes, and as measure_and_round's one.
  row("x s, tensor_stats, quantize fp16 (3 passes)", 8, [&] {
    cuda::quantize(in.data(), out.data(), n, Format::fp32, {}, 0.5f, ctx.stream());
    cuda::tensor_stats(ctx, out.data(), n, Format::fp16, {}, stats.data());
    cuda::quantize(out.data(), out.data(), n, Format::fp16, {}, 1.0f, ctx.stream());
  });
  row("measure_and_round fp16 (x s, one pass)", 8, [&] {
    cuda::measure_and_round(ctx, {in.data(), n, Format::fp16, {}}, {out.data(), true, 0.5f, nullptr}, stats.data());
  });
  row("to_fp16 (fp32 -> __half)", 6, [&] { cuda::to_fp16(in.data(), half.data(), n, ctx.stream()); });
  row("to_bf16 (fp32 -> __nv_bfloat16)", 6, [&] { cuda::to_bf16(in.data(), bf16.data(), n, ctx.stream()); });
  row("unscale_accumulate (g, master -> master)", 12, [&] {
    const cuda::UnscaleJob job{in.data(), master.data(), n, 1024.0};
    cuda::unscale_accumulate(&job, 1, flag.data(), ctx.stream());
  });
  // The column passes of resnet-mini's stage-1 convolution (16 → 16 channels, 28×28, 3×3, padding 1),
  // over as many samples as give about n column entries (at least one): im2col reads the input and
  // writes the columns, col2im the reverse (backward's layout, the batch side by side).
  const cuda::ConvGeometry geo{0, 16, 28, 28, 3, 1, 1};
  const std::int64_t per_sample = geo.col_rows() * geo.col_cols();
  cuda::ConvGeometry conv = geo;
  conv.n = std::max<std::int64_t>(1, static_cast<std::int64_t>(n) / per_sample);
  const auto cols_n = static_cast<std::size_t>(conv.n * per_sample);
  const auto x_n = static_cast<std::size_t>(conv.n * geo.channels * geo.h * geo.w);
  cuda::DeviceBuffer<float> cols(cols_n), x(x_n);
  x.fill_bytes(0, ctx.stream());  // then gradient-like values, as many as there are
  GS_CUDA_CHECK(cudaMemcpyAsync(x.data(), in.data(), std::min(x_n, n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                ctx.stream()));
  const double conv_bytes = 4.0 * static_cast<double>(cols_n + x_n);
  row_bytes("im2col 16ch 28x28 3x3 (x -> columns)", conv_bytes,
            [&] { cuda::im2col(x.data(), conv, cols.data(), ctx.stream(), cuda::ColumnLayout::batch_wide); });
  row_bytes("col2im 16ch 28x28 3x3 (columns -> x)", conv_bytes,
            [&] { cuda::col2im(cols.data(), conv, x.data(), ctx.stream(), cuda::ColumnLayout::batch_wide); });
  bench_conv_forward(ctx, repeats);
  return 0;
}

}  // namespace gradscale::cli
