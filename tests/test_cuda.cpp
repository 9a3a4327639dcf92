// Tests of lib/cuda that need no GPU (built only with CUDA): the check macros, the entries' argument
// checks before any device work, clear CudaErrors instead of crashes without a device, and bench cuda.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/core/random.h"
#include "lib/cuda/check.h"
#include "lib/cuda/context.h"
#include "lib/cuda/convert.h"
#include "lib/cuda/device_buffer.h"
#include "lib/cuda/edge_counts.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/maxpool.h"
#include "lib/cuda/nonfinite.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/relu.h"
#include "lib/cuda/sgd.h"
#include "lib/cuda/stats.h"
#include "lib/cuda/unscale.h"
#include "lib/instrument/finite_scan.h"
#include "lib/instrument/histogram.h"
#include "lib/numeric/quantize.h"
#include "tests/cli_run.h"
#include "tests/cuda_test.h"

using namespace gradscale;
using Catch::Matchers::Contains;
using test::bit_mismatches;
using test::bits_of;
using test::float_of;

TEST_CASE("GS_CUDA_CHECK and GS_CUBLAS_CHECK throw CudaError naming the call, the status and file:line",
          "[cuda]") {
  auto cuda_fails = [] { return cudaErrorInvalidValue; };
  try {
    GS_CUDA_CHECK(cuda_fails());
    FAIL("no exception");
  } catch (const CudaError& e) {
    CHECK_THAT(e.what(), Contains("`cuda_fails()` failed") && Contains("cudaErrorInvalidValue") &&
                             Contains("test_cuda.cpp:"));
  }
  auto cublas_fails = [] { return CUBLAS_STATUS_INVALID_VALUE; };
  try {
    GS_CUBLAS_CHECK(cublas_fails());
    FAIL("no exception");
  } catch (const CudaError& e) {
    CHECK_THAT(e.what(), Contains("`cublas_fails()` failed") && Contains("CUBLAS_STATUS_INVALID_VALUE") &&
                             Contains("test_cuda.cpp:"));
  }
  CHECK_NOTHROW([] { GS_CUDA_CHECK(cudaSuccess); }());
  CHECK_NOTHROW([] { GS_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS); }());
}

TEST_CASE("CUDA entries check their arguments before touching the device", "[cuda]") {
  // These run with or without a GPU: the checks come before any CUDA call.
  CHECK_THROWS_WITH(cuda::quantize(nullptr, nullptr, 10, Format::fp16, {}, 1.0f, nullptr),
                    Contains("null pointer"));
  CHECK_NOTHROW(
      cuda::quantize(nullptr, nullptr, 0, Format::fp16, {}, 1.0f, nullptr));  // empty: nothing to do
  CHECK_THROWS_AS(
      cuda::max_pool_forward(nullptr, cuda::PoolGeometry{1, 3, 3, 0, 1}, nullptr, nullptr, nullptr),
      ShapeError);
  CHECK_THROWS_AS(cuda::im2col(nullptr, cuda::ConvGeometry{1, 1, 2, 2, 5, 1, 0}, nullptr, nullptr),
                  ShapeError);
  CHECK_THROWS_WITH(cuda::im2col_16bit(nullptr, cuda::ConvGeometry{1, 1, 2, 2, 1, 1, 0}, nullptr,
                                       cuda::DeviceType::f32, nullptr),
                    Contains("fp32 is not a 16-bit type"));
  const cuda::UnscaleJob zero_scale{nullptr, nullptr, 0, 0.0};
  int flag = 0;
  CHECK_THROWS_AS(cuda::unscale_accumulate(&zero_scale, 1, &flag, nullptr), NumericError);
  cuda::DeviceOptimizerStep* no_step = nullptr;
  CHECK_THROWS_AS(cuda::sgd_update(nullptr, nullptr, nullptr, 0, cuda::SgdParams{0.1, 1.5}, no_step, nullptr),
                  ConfigError);
  CHECK_THROWS_WITH(cuda::relu_forward(nullptr, nullptr, 4, nullptr), Contains("null pointer"));
  cuda::DeviceEdgeCounts counts{};
  CHECK_THROWS_WITH(cuda::count_about_edge(nullptr, 4, 1u, &counts, nullptr), Contains("null data"));
  CHECK_NOTHROW(cuda::count_about_edge(nullptr, 0, 1u, &counts, nullptr));
  const cuda::NonFiniteJob null_job{nullptr, 3};
  unsigned long long first = 0;
  CHECK_THROWS_WITH(cuda::first_nonfinite(&null_job, 1, &first, nullptr), Contains("tensor 0 of 3 elements is null"));
  CHECK_NOTHROW(cuda::first_nonfinite(nullptr, 0, nullptr, nullptr));
}

TEST_CASE("Without a CUDA device the backend throws clear CudaErrors and never crashes", "[cuda]") {
  if (cuda::device_count() > 0)
    test::skip_test("a CUDA device is present: the no-device path cannot run here");
  CHECK(!cuda::no_device_reason().empty());
  CHECK_THROWS_AS(cuda::CudaContext(), CudaError);
  CHECK_THROWS_WITH(cuda::CudaContext(), Contains("no CUDA device"));
  CHECK_THROWS_WITH(cuda::DeviceBuffer<float>(16), Contains("cudaMalloc"));
  // A kernel launch without a device is reported by the launch check, not by a crash.
  float* fake = reinterpret_cast<float*>(std::uintptr_t{4096});
  CHECK_THROWS_AS(cuda::relu_forward(fake, fake, 16, nullptr), CudaError);
  CHECK_THROWS_AS(cuda::quantize(fake, fake, 16, Format::fp16, {}, 1.0f, nullptr), CudaError);
}

TEST_CASE("bench cuda prints one row per kernel, or one line and exit 0 without a GPU", "[cuda][cli]") {
  test::require_gpu_hardware("bench cuda is the CLI's, built on the real CUDA runtime, and measures speed");
  const test::CliResult r = test::run_cli("bench cuda --elements 100003 --repeats 2");
  REQUIRE(r.status == 0);
  REQUIRE(!r.lines.empty());
  if (cuda::device_count() == 0) {
    REQUIRE(r.lines.size() == 1);
    CHECK_THAT(r.lines[0], Contains("gradscale bench cuda: no CUDA device"));
    return;
  }
  CHECK_THAT(r.lines[0], Contains("gradscale bench cuda: ") && Contains("100003 floats"));
  std::string all;
  for (const std::string& l : r.lines) all += l + "\n";
  for (const char* row : {"device-to-device copy", "tensor_stats fp16", "max_abs_bits", "quantize fp16",
                          "quantize fp8_e4m3", "measure_and_round fp16", "to_fp16", "to_bf16", "unscale_accumulate",
                          "im2col", "col2im"})
    CHECK_THAT(all, Contains(row));
}
