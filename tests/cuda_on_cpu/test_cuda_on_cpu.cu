// Tests of the CPU execution target itself (built through kernel_shim.h like lib/cuda's .cu files): a
// kernel with a race or a missing barrier fails its launch; barriers, shuffles and ballots give CUDA's
// results; copies in the wrong direction and kernels given host pointers are refused.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <iostream>
#include <numeric>
#include <vector>

namespace {

using Catch::Matchers::Contains;

cudaError_t launch_status() {
  return cudaGetLastError();
}

template <class T>
T* device_copy(const std::vector<T>& v) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, v.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> host_copy(const T* d, std::size_t n) {
  std::vector<T> v(n);
  REQUIRE(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}

// Each thread writes its value to shared memory, then reads its neighbour's: right with the barrier,
// a race without it.
__global__ void neighbour_kernel(const int* in, int* out, bool with_barrier) {
  __shared__ int s[64];
  s[threadIdx.x] = in[threadIdx.x];
  if (with_barrier) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Every thread of every block stores to the same word: the last writer wins, a race.
__global__ void last_writer_kernel(int* out) {
  out[0] = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
}

__global__ void shuffle_kernel(const int* in, int* down, int* up, int* bfly, int* index, unsigned* ballot) {
  const int t = static_cast<int>(threadIdx.x);
  const int v = in[t];
  down[t] = __shfl_down_sync(0xFFFFFFFFu, v, 3);
  up[t] = __shfl_up_sync(0xFFFFFFFFu, v, 5, 16);
  bfly[t] = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  index[t] = __shfl_sync(0xFFFFFFFFu, v, 7);
  ballot[t] = __ballot_sync(0xFFFFFFFFu, v % 3 == 0);
}

__global__ void syncthreads_or_kernel(const int* in, int* out) {
  const int any = __syncthreads_or(in[threadIdx.x] != 0);
  const int count = __syncthreads_count(in[threadIdx.x] != 0);
  if (threadIdx.x == 0) {
    out[0] = any;
    out[1] = count;
  }
}

__global__ void out_of_bounds_kernel(float* p, int n) {
  p[n + static_cast<int>(threadIdx.x)] = 1.0f;  // past the end: AddressSanitizer's to report
}

}  // namespace

TEST_CASE("executor: a barrier orders shared memory and without it the two thread orders differ: the launch fails",
          "[cuda_on_cpu]") {
  std::vector<int> in(64);
  std::iota(in.begin(), in.end(), 100);
  int* d_in = device_copy(in);
  int* d_out = device_copy(std::vector<int>(64, 0));
  neighbour_kernel<<<1, 64>>>(d_in, d_out, true);
  REQUIRE(launch_status() == cudaSuccess);
  const std::vector<int> out = host_copy(d_out, 64);
  for (int t = 0; t < 64; ++t) CHECK(out[static_cast<std::size_t>(t)] == 100 + (t + 1) % 64);
  // New values: without the barrier a thread may read what the last launch left in shared memory.
  for (int& v : in) v += 1000;
  REQUIRE(cudaMemcpy(d_in, in.data(), 64 * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  neighbour_kernel<<<1, 64>>>(d_in, d_out, false);
  CHECK(launch_status() == cudaErrorLaunchFailure);
  last_writer_kernel<<<3, 32>>>(d_out);
  CHECK(launch_status() == cudaErrorLaunchFailure);
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_CASE("executor: warp shuffles, ballots and __syncthreads_or give CUDA's results", "[cuda_on_cpu]") {
  std::vector<int> in(64);
  for (int t = 0; t < 64; ++t) in[static_cast<std::size_t>(t)] = 1000 + t;
  int* d_in = device_copy(in);
  std::vector<int*> outs;
  for (int i = 0; i < 4; ++i) outs.push_back(device_copy(std::vector<int>(64, -1)));
  unsigned* d_ballot = device_copy(std::vector<unsigned>(64, 0));
  shuffle_kernel<<<1, 64>>>(d_in, outs[0], outs[1], outs[2], outs[3], d_ballot);
  REQUIRE(launch_status() == cudaSuccess);
  const std::vector<int> down = host_copy(outs[0], 64), up = host_copy(outs[1], 64), bfly = host_copy(outs[2], 64),
                         index = host_copy(outs[3], 64);
  const std::vector<unsigned> ballot = host_copy(d_ballot, 64);
  for (int t = 0; t < 64; ++t) {
    const auto i = static_cast<std::size_t>(t);
    const int lane = t % 32, warp = t / 32;
    CHECK(down[i] == (lane + 3 < 32 ? in[i + 3] : in[i]));  // the top lanes keep their own value
    CHECK(up[i] == (lane % 16 >= 5 ? in[i - 5] : in[i]));    // within sections of 16 lanes
    CHECK(bfly[i] == in[static_cast<std::size_t>(t ^ 1)]);
    CHECK(index[i] == in[static_cast<std::size_t>(warp * 32 + 7)]);
    unsigned want = 0;
    for (int l = 0; l < 32; ++l)
      if (in[static_cast<std::size_t>(warp * 32 + l)] % 3 == 0) want |= 1u << l;
    CHECK(ballot[i] == want);
  }
  int* d_flags = device_copy(std::vector<int>(64, 0));
  int* d_res = device_copy(std::vector<int>(2, -1));
  syncthreads_or_kernel<<<1, 64>>>(d_flags, d_res);
  REQUIRE(launch_status() == cudaSuccess);
  CHECK(host_copy(d_res, 2) == std::vector<int>{0, 0});
  std::vector<int> flags(64, 0);
  flags[37] = flags[5] = 1;
  REQUIRE(cudaMemcpy(d_flags, flags.data(), 64 * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  syncthreads_or_kernel<<<1, 64>>>(d_flags, d_res);
  REQUIRE(launch_status() == cudaSuccess);
  CHECK(host_copy(d_res, 2) == std::vector<int>{1, 2});
  for (int* p : outs) cudaFree(p);
  cudaFree(d_in);
  cudaFree(d_ballot);
  cudaFree(d_flags);
  cudaFree(d_res);
}

TEST_CASE("executor: copies in the wrong direction and kernels given host memory are refused", "[cuda_on_cpu]") {
  std::vector<int> host(16, 7);
  int* d = device_copy(host);
  CHECK(cudaMemcpy(d, host.data(), 16 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(host.data(), d, 16 * sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, d + 1, 16 * sizeof(int), cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);  // past the end
  CHECK(cudaMemsetAsync(host.data(), 0, 4, nullptr) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  last_writer_kernel<<<1, 1>>>(host.data());
  CHECK(launch_status() == cudaErrorIllegalAddress);
  CHECK(host[0] == 7);  // never run
  last_writer_kernel<<<1, 2000>>>(d);
  CHECK(launch_status() == cudaErrorInvalidConfiguration);
  CHECK(cudaFree(host.data()) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  cudaFree(d);
}

// Only under AddressSanitizer (GRADSCALE_CUDA_ON_CPU_ASAN): the kernel writes past its allocation, so
// the process dies with ASan's report, which is what ctest looks for (CMakeLists.txt here).
TEST_CASE("executor: a kernel writing past its buffer is reported by AddressSanitizer", "[cuda_on_cpu][asan]") {
#if !defined(__SANITIZE_ADDRESS__)
  std::cout << "SKIPPED: needs the AddressSanitizer build of the CPU target (GRADSCALE_CUDA_ON_CPU_ASAN=ON)"
            << std::endl;
  std::exit(4);
#else
  float* d = device_copy(std::vector<float>(10, 0.0f));
  out_of_bounds_kernel<<<1, 4>>>(d, 10);
  (void)cudaGetLastError();
  cudaFree(d);
#endif
}
