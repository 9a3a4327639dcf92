// SPEC §3 statistics on the GPU (see stats.h). One kernel per launch of up to 32 tensors,
// stats_partial_kernel, grid (blocks, tensors): each thread walks its tensor with a grid-stride loop,
// adds the moments, and counts each value once in its warp's shared histogram of keys (below); a block
// derives from those counts how many of its values reach each threshold (the class of a value is that
// number, exactly as histogram.cpp's class_index) and each binade's count. A block writes one partial
// record, adds its binade counts to the launch's
// accumulators (integer atomics: exact in any order) and counts itself in; the tensor's last block to
// arrive moves the bins into the output, combines the partial records in a fixed order (the same sums
// whichever block is last) and writes every field of the output, so no second kernel waits on the
// first and no fill precedes the launch (the accumulators are left zeroed, Accumulators below).
//
// For the memory's speed a thread loads kUnroll elements of its grid-stride walk before it uses the
// first (one load in flight per resident thread leaves the memory idle part of the time), and visits
// them in the walk's order, so its sums are those of the plain loop. A column source's value is itself a
// sum of up to k·k loads, which are in flight together already: it is loaded one at a time, and its
// kernels are held to 64 registers (__launch_bounds__(kBlock, 4): 4 blocks per SM, without spills on
// sm_80 or sm_90), where four such sums at once took 128 (2 blocks per SM).
//
// With a StatsDecision, the tensor that finishes last (an arrival count in the accumulators) has its
// block copy the records the decision reads into shared memory and one thread take it (decide.cuh).
//
// measure_and_round is the same kernel with a store: each thread multiplies the values it loaded, visits
// them, and writes them (rounded) back; the grid, the walk and the reductions are tensor_stats', so the
// statistics are the same bits as those of the unfused passes. col2im_measured stores col2im's sums
// (im2col.cuh) as its values: the walk is tensor_stats's over gx, so each index is divided by the plane's
// size and the channel count in 64 bits, where col2im's own kernel divides once per plane; whether the
// one pass is faster than col2im and tensor_stats apart is for a GPU to say.
#include "lib/cuda/stats.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "lib/cuda/check.h"
#include "lib/cuda/decide.cuh"
#include "lib/cuda/im2col.cuh"
#include "lib/cuda/launch.h"
#include "lib/cuda/reduce.cuh"
#include "lib/cuda/round.cuh"
#include "lib/instrument/class_counts.h"

namespace gradscale::cuda {
namespace {

constexpr std::uint32_t kAbs = 0x7FFFFFFFu;
constexpr std::uint32_t kInf = 0x7F800000u;
constexpr int kJobsPerLaunch = 32;
constexpr unsigned kMaxBlocksPerJob = 1024;  // a constant, not a device property: reproducible sums
constexpr unsigned kValuesPerThread = 8;     // a statistics grid: one block per kBlock·8 values
constexpr unsigned kWarps = kBlock / 32;
constexpr std::size_t kMaxElements = std::size_t{1} << 40;  // per-thread and per-warp counters stay 32-bit
constexpr unsigned kUnroll = 4;  // loads a thread has in flight in the grid-stride walks below

// The tensors of one launch, by value (kernel parameter space).
struct StatsTable {
  const float* data[kJobsPerLaunch];
  unsigned long long n[kJobsPerLaunch];
  RoundThresholds thresholds[kJobsPerLaunch];
  DeviceStats* out;  // out[j] for job j of this launch
  int count;
};

// What measure_and_round's pass stores (the launch of one tensor): v = m·x into dst, rounded.
struct Store {
  float* dst = nullptr;
  float multiplier = 1.0f;
  const double* device_multiplier = nullptr;  // m read from the device when not null
  DeviceRounding rounding{};                  // identity: v itself
  float* master = nullptr;                    // unscaled into (StoredRounding::master) when not null
  float scale = 1.0f;
  const double* device_scale = nullptr;
  int* found_inf = nullptr;
  bool divide = false;                        // the stored values divided (StoredRounding::divide)
  float divisor = 1.0f;
  const double* device_divisor = nullptr;
  DeviceScale* decides_r = nullptr;  // r decided into this entry before the walk (StoredRounding::decides_r)
  const DeviceScale* r_in = nullptr;
  double u_max = 0;
};

// Where a launch's values come from: the tensors' arrays, or (col2im_measured, one tensor) col2im's sum
// over the columns of a convolution, for the element i of [n, C, h, w].
enum SourceKind : int { kArray, kColumnsUnitStride, kColumns };
struct Columns {
  const float* cols = nullptr;
  std::int64_t channels = 0, plane = 0;  // C, h·w
  int k = 1, stride = 1, pad = 0, w = 1, ho = 1, wo = 1;
  ColumnStrides cs{0, 0};
};

// What the launch decides after its statistics (tensor_stats with a StatsDecision).
struct Then {
  bool decides = false;
  StatsDecision decision;
};
constexpr int kMaxDecisionJobs = StatsDecision::kMaxTensors;  // records a decision reads (into the histogram's memory)

// What the blocks of a launch add up across the grid, in ctx.zeroed_scratch(): each tensor's bins and
// arrived blocks, and the tensors finished (a decision's arrival). The last block of a tensor moves its
// bins into the output and zeroes them, and the decision's thread its count, so the memory is zero again
// after every launch and no fill precedes one.
struct Accumulators {
  unsigned long long binades[kJobsPerLaunch][kBinadeCount];
  unsigned long long arrived[kJobsPerLaunch];
  unsigned long long finished;
};

// One block's share of one tensor.
struct BlockPartial {
  unsigned long long reached[5];  // |v| != 0, >= first_nonzero, >= first_normal, >= first_overflow, >= inf
  double sum, sum_squares;        // finite values
  float lo, hi;                   // min and max finite value (+inf / -inf when none)
  unsigned nonzero_m1;            // min over (|v| bits - 1), unsigned: 0 wraps to the top
};

// The histogram of keys. A value's key is its exponent field, e = |v| bits >> 23 (0: zero or
// subnormal; 255: not finite), and whether |v| reaches the split of e: the one threshold of RoundThresholds
// inside binade e (its bits above e << 23), or 0 where none is (every value of e reaches it). Then for
// each threshold t in exponent e_t >= 1, the values reaching t are those of every exponent above e_t
// and those of e_t reaching its split (all of e_t when t = e_t << 23); each binade's count is its
// exponent's (floor(log2|v|) = e - 127 for e >= 1). A subnormal (e = 0, |v| != 0), rare, is also counted
// in the block's own counters: its binade, (31 - clz) - 149, and which thresholds it reaches — every
// threshold inside exponent 0 (bf16 has two) is counted there. So a value costs one shared read and one
// shared atomic, and no comparison per threshold (docs/gpu.md: the loop's instructions per value).
constexpr unsigned kKeys = 256;                    // exponent fields
constexpr unsigned kSubnormalBinades = 23;         // floor(log2|v|) = -149 .. -127
constexpr int kSubnormalBin = -149 - kBinadeMin;   // the bin of the smallest subnormal
constexpr int kThresholds = 5;                     // |v| >= 1 (not zero), the three of RoundThresholds, inf
static_assert(kBinadeMin <= -149 && kBinadeMax >= 127, "every binade of a finite float32 has its own bin");

__host__ __device__ inline std::uint32_t threshold_bits(const RoundThresholds& th, int k) {
  return k == 0 ? 1u : k == 1 ? th.first_nonzero : k == 2 ? th.first_normal : k == 3 ? th.first_overflow : kInf;
}

// Another block's record, read past this SM's L1 (which may hold none of it, but is not coherent).
__device__ BlockPartial load_partial(const BlockPartial* at) {
  const volatile BlockPartial* v = at;
  BlockPartial p;
  for (int k = 0; k < 5; ++k) p.reached[k] = v->reached[k];
  p.sum = v->sum;
  p.sum_squares = v->sum_squares;
  p.lo = v->lo;
  p.hi = v->hi;
  p.nonzero_m1 = v->nonzero_m1;
  return p;
}

// The last block of tensor `job`: its `blocks` records `part` combined in a fixed order (each thread a
// fixed subset, then block_reduce), and the output written.
__device__ void finalize(const StatsTable& table, int job, const BlockPartial* part, unsigned blocks) {
  unsigned long long reached[5] = {0, 0, 0, 0, 0};
  double sum = 0, sum_squares = 0;
  float lo = __uint_as_float(kInf), hi = -__uint_as_float(kInf);
  unsigned nonzero_m1 = 0xFFFFFFFFu;
  for (unsigned b = threadIdx.x; b < blocks; b += blockDim.x) {
    const BlockPartial p = load_partial(part + b);
    for (int k = 0; k < 5; ++k) reached[k] += p.reached[k];
    sum += p.sum;
    sum_squares += p.sum_squares;
    lo = fminf(lo, p.lo);
    hi = fmaxf(hi, p.hi);
    nonzero_m1 = min(nonzero_m1, p.nonzero_m1);
  }
  for (int k = 0; k < 5; ++k) reached[k] = device::block_reduce(reached[k], device::Sum());
  sum = device::block_reduce(sum, device::Sum());
  sum_squares = device::block_reduce(sum_squares, device::Sum());
  lo = device::block_reduce(lo, device::MinFloat());
  hi = device::block_reduce(hi, device::MaxFloat());
  nonzero_m1 = device::block_reduce(nonzero_m1, device::MinUnsigned());
  if (threadIdx.x != 0) return;

  const unsigned long long n = table.n[job];
  DeviceStats& s = table.out[job];
  set_class_counts(s, n, reached);
  s.sum = sum;
  s.sum_squares = sum_squares;
  s.min = s.count > 0 ? lo : 0.0;
  s.max = s.count > 0 ? hi : 0.0;
  s.max_abs = s.count > 0 ? fmax(-s.min, s.max) : 0.0;
  s.min_nonzero_abs =
      (nonzero_m1 + 1u < kInf && nonzero_m1 != 0xFFFFFFFFu) ? __uint_as_float(nonzero_m1 + 1u) : 0.0;
}

// The launch's last tensor to finish (its last block; every thread) takes `then`'s decision: the records
// it reads copied by the block from global memory (other blocks wrote them) into `words`, then one thread.
__device__ void decide_after(const StatsTable& table, int job, const StatsDecision& then, Accumulators* acc,
                             unsigned long long* words) {
  if (then.kind == StatsDecision::kWeightGradScaleEach) {  // this tensor's own r: no wait for the others
    // Its record, written by this block's thread 0 in finalize, is read by that thread.
    if (threadIdx.x == 0) device::decide_weight_grad(table.out + job, 1, then.u_max, then.in, then.outs[job]);
    return;
  }
  bool last = false;
  if (threadIdx.x == 0) {
    if (table.count == 1) {
      last = true;
    } else {  // this tensor's record is written (finalize); the fence puts it before the arrival
      __threadfence();
      last = atomicAdd(&acc->finished, 1ull) == static_cast<unsigned long long>(table.count) - 1;
      if (last) acc->finished = 0;  // every other tensor has arrived: zero again for the next launch
    }
  }
  if (!__syncthreads_or(last)) return;
  __threadfence();
  // Which records, in which order: the local rule's grad / weight / upstream, or every job.
  int jobs[kMaxDecisionJobs] = {-1, -1, -1};
  if (then.kind == StatsDecision::kLocalScale) {
    jobs[0] = then.grad;
    jobs[1] = then.weight;
    jobs[2] = then.upstream;
  } else {
    for (int j = 0; j < table.count; ++j) jobs[j] = j;
  }
  constexpr unsigned kWords = sizeof(DeviceStats) / sizeof(unsigned long long);
  for (int k = 0; k < kMaxDecisionJobs; ++k) {
    if (jobs[k] < 0) continue;
    const volatile unsigned long long* from =
        reinterpret_cast<const volatile unsigned long long*>(table.out + jobs[k]);
    for (unsigned w = threadIdx.x; w < kWords; w += blockDim.x) words[k * kWords + w] = from[w];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const auto* record = reinterpret_cast<const DeviceStats*>(words);
  const auto at = [&](int k) { return jobs[k] < 0 ? nullptr : record + k; };
  switch (then.kind) {
    case StatsDecision::kLocalScale:
      device::decide_local(then.rule, at(0), at(1), at(2), then.in, then.out);
      break;
    case StatsDecision::kWeightGradScale:
      device::decide_weight_grad(record, table.count, then.u_max, then.in, then.out);
      break;
    case StatsDecision::kLossScale:
      device::decide_loss(then.loss, record, then.out);
      break;
    case StatsDecision::kWeightGradScaleEach:  // each tensor's last block decided (above)
      break;
  }
}

// kStore: the launch has one tensor, and each value is multiplied before its visit and stored after it.
// kSource: where the values come from (a column source has one tensor, and kStore writes its sums).
template <bool kStore, int kSource>
__global__ void __launch_bounds__(kBlock, kSource == kArray ? 0 : 4) stats_partial_kernel(StatsTable table, BlockPartial* partials,
                                                               Accumulators* acc, Store store, Then then,
                                                               Columns columns) {
  // The warps' histograms of keys (e, plus kKeys where |v| reaches e's split); after the block's arrival, the
  // records a decision reads (decide_after). The splits, and the subnormals' counters.
  alignas(8) __shared__ unsigned hist[kWarps][2 * kKeys];
  __shared__ std::uint32_t split[kKeys];
  __shared__ unsigned subnormal_bins[kSubnormalBinades];
  __shared__ unsigned subnormal_reached[kThresholds];
  static_assert(kMaxDecisionJobs * sizeof(DeviceStats) <= sizeof(hist), "a decision's records fit");
  static_assert(sizeof(DeviceStats) % sizeof(unsigned long long) == 0, "records are whole words");
  const int job = static_cast<int>(blockIdx.y);
  const RoundThresholds th = table.thresholds[job];
  for (unsigned i = threadIdx.x; i < kWarps * 2 * kKeys; i += blockDim.x) (&hist[0][0])[i] = 0;
  for (unsigned e = threadIdx.x; e < kKeys; e += blockDim.x) {
    std::uint32_t t = 0;  // a threshold above e << 23 inside exponent e >= 1 (at most one: check_thresholds)
    for (int k = 1; k < kThresholds - 1; ++k) {
      const std::uint32_t bits = threshold_bits(th, k);
      if (e != 0 && bits >> 23 == e && (bits & 0x7FFFFFu) != 0) t = bits;
    }
    split[e] = t;
  }
  for (unsigned i = threadIdx.x; i < kSubnormalBinades; i += blockDim.x) subnormal_bins[i] = 0;
  if (threadIdx.x < static_cast<unsigned>(kThresholds)) subnormal_reached[threadIdx.x] = 0;
  __syncthreads();

  const float* v = table.data[job];
  // Value i of the tensor: the array's, or the sum col2im writes there (im2col.cuh).
  const auto load = [&](std::size_t i) -> float {
    if constexpr (kSource == kArray) {
      return v[i];
    } else {
      const auto e = static_cast<std::int64_t>(i);
      const std::int64_t p = e / columns.plane, b = p / columns.channels, c = p - b * columns.channels;
      const float* rows = columns.cols + b * columns.cs.sample + c * columns.k * columns.k * columns.cs.row;
      return device::col2im_sum<kSource == kColumnsUnitStride>(rows, columns.k, columns.stride, columns.pad,
                                                               columns.w, columns.ho, columns.wo, columns.cs.row,
                                                               static_cast<int>(e - p * columns.plane));
    }
  };
  const std::size_t n = table.n[job];
  unsigned* my_hist = hist[threadIdx.x / 32];
  double sum = 0, sum_squares = 0;
  float lo = __uint_as_float(kInf), hi = -__uint_as_float(kInf);
  unsigned nonzero_m1 = 0xFFFFFFFFu;
  auto visit = [&](float x) {
    const std::uint32_t a = __float_as_uint(x) & kAbs;
    const std::uint32_t e = a >> 23;
    atomicAdd((a >= split[e] ? my_hist + kKeys : my_hist) + e, 1u);
    nonzero_m1 = min(nonzero_m1, a - 1u);
    if (e == 0 && a != 0u) {  // a subnormal: its binade, and the thresholds inside exponent 0
      atomicAdd(&subnormal_bins[(31 - __clz(static_cast<int>(a)))], 1u);
      for (int k = 0; k < kThresholds; ++k)
        if (a >= threshold_bits(th, k)) atomicAdd(&subnormal_reached[k], 1u);
    }
    if (a < kInf) {
      const double d = x;
      sum += d;
      sum_squares += d * d;
      lo = fminf(lo, x);
      hi = fmaxf(hi, x);
    }
  };
  // A weight gradient's r first (one block, StoredRounding::decides_r): from the largest finite |v| and
  // whether a value is not finite, as decide_weight_grad reads tensor_stats's record (max_abs, nonfinite);
  // the device values below may point into the decided entry, so they are read past L1 (volatile).
  if constexpr (kStore) {
    if (store.decides_r != nullptr) {
      unsigned top = 0, bad_values = 0;
      for (std::size_t k = threadIdx.x; k < n; k += blockDim.x) {
        const std::uint32_t a = __float_as_uint(load(k)) & kAbs;
        if (a < kInf)
          top = max(top, a);
        else
          bad_values = 1;
      }
      top = device::block_reduce(top, device::MaxUnsigned());
      bad_values = device::block_reduce(bad_values, device::MaxUnsigned());
      if (threadIdx.x == 0)
        device::decide_weight_grad_of(bad_values ? INFINITY : static_cast<double>(__uint_as_float(top)), store.u_max,
                                      store.r_in, store.decides_r);
      __syncthreads();
    }
  }
  const auto device_value = [](const double* p) { return *static_cast<const volatile double*>(p); };
  // As cuda::quantize and apply_local_scale multiply: one fp32 product, none for a factor of 1.
  float m = 1.0f;
  if constexpr (kStore)
    m = store.device_multiplier != nullptr ? static_cast<float>(device_value(store.device_multiplier))
                                           : store.multiplier;
  const auto scaled = [m](float x) { return m == 1.0f ? x : x * m; };
  // The unscale: unscale_accumulate's operations, in the same order, on each stored value.
  float unscale = 1.0f;
  bool bad = false;
  if constexpr (kStore) {
    if (store.master != nullptr) {
      unscale = store.device_scale != nullptr ? static_cast<float>(device_value(store.device_scale)) : store.scale;
      bad = !(unscale >= 1.17549435e-38f && unscale <= 3.40282347e+38f);
    }
  }
  // The division after the rounding: divide_by_scale's range check on a device divisor, then one fp32
  // division per value.
  bool divided = false;
  float divisor = 1.0f;
  if constexpr (kStore) {
    divided = store.divide;
    divisor = store.divisor;
    if (store.device_divisor != nullptr) {
      const double d = device_value(store.device_divisor);
      divided = d >= 1.1754943508222875e-38 && d <= 3.4028234663852886e+38;
      divisor = divided ? static_cast<float>(d) : 1.0f;
    }
  }
  const auto put = [&](std::size_t at, float x) {
    const float r = device::round_to_format(x, store.rounding);
    store.dst[at] = divided ? r / divisor : r;
    if (store.master != nullptr) {
      bad |= !isfinite(r);
      const float accumulated = store.master[at] + r / unscale;
      store.master[at] = accumulated;
      bad |= !isfinite(accumulated);
    }
  };
  // The thread's walk, i, i + stride, i + 2·stride, ..., visited in that order, kLoads values at a time.
  constexpr unsigned kLoads = kSource == kArray ? kUnroll : 1;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kLoads - 1) * stride < n; i += kLoads * stride) {
    float x[kLoads];
    for (unsigned k = 0; k < kLoads; ++k) x[k] = load(i + k * stride);
    if constexpr (kStore)
      for (unsigned k = 0; k < kLoads; ++k) x[k] = scaled(x[k]);
    for (unsigned k = 0; k < kLoads; ++k) visit(x[k]);
    if constexpr (kStore)
      for (unsigned k = 0; k < kLoads; ++k) put(i + k * stride, x[k]);
  }
  for (; i < n; i += stride) {
    if constexpr (kStore) {
      const float x = scaled(load(i));
      visit(x);
      put(i, x);
    } else {
      visit(load(i));
    }
  }

  if constexpr (kStore) {  // the unscale's flag: any thread's non-finite value
    if (store.master != nullptr && __syncthreads_or(bad) && threadIdx.x == 0) *store.found_inf = 1;
  }
  // The keys' counts into the thresholds reached and the binades' counts (thread e: exponent e).
  __syncthreads();  // every count of the shared histograms is in
  unsigned long long reached[kThresholds] = {0, 0, 0, 0, 0};
  unsigned long long* bins = acc->binades[job];
  for (unsigned e = threadIdx.x; e < kKeys; e += blockDim.x) {
    unsigned all = 0, above = 0;  // values of exponent e; those reaching its split
    for (unsigned w = 0; w < kWarps; ++w) {
      all += hist[w][e] + hist[w][kKeys + e];
      above += hist[w][kKeys + e];
    }
    for (int k = 0; k < kThresholds; ++k) {
      const std::uint32_t t = threshold_bits(th, k), et = t >> 23;
      if (e > et)
        reached[k] += all;
      else if (e == et && e != 0)
        reached[k] += (t & 0x7FFFFFu) != 0 ? above : all;  // inside e: its split; at e << 23: all of e
    }
    if (e == 0)
      for (int k = 0; k < kThresholds; ++k) reached[k] += subnormal_reached[k];  // exponent 0's own
    if (e != 0 && e != kKeys - 1 && all != 0)
      atomicAdd(&bins[static_cast<int>(e) - 127 - kBinadeMin], static_cast<unsigned long long>(all));
  }
  for (unsigned j = threadIdx.x; j < kSubnormalBinades; j += blockDim.x)
    if (subnormal_bins[j] != 0)
      atomicAdd(&bins[kSubnormalBin + static_cast<int>(j)], static_cast<unsigned long long>(subnormal_bins[j]));
  BlockPartial p;
  for (int k = 0; k < kThresholds; ++k)
    p.reached[k] = device::block_reduce<unsigned long long>(reached[k], device::Sum());
  p.sum = device::block_reduce(sum, device::Sum());
  p.sum_squares = device::block_reduce(sum_squares, device::Sum());
  p.lo = device::block_reduce(lo, device::MinFloat());
  p.hi = device::block_reduce(hi, device::MaxFloat());
  p.nonzero_m1 = device::block_reduce(nonzero_m1, device::MinUnsigned());
  BlockPartial* part = partials + static_cast<std::size_t>(job) * gridDim.x;
  if (threadIdx.x == 0) part[blockIdx.x] = p;
  // Arrival: the blocks done. The fence puts this block's record and bins before its arrival for every
  // other block.
  __threadfence();
  bool last = false;
  if (threadIdx.x == 0) last = atomicAdd(&acc->arrived[job], 1ull) == gridDim.x - 1;
  if (!__syncthreads_or(last)) return;
  __threadfence();
  // The last block: the bins into the output (read past L1: other blocks added them), the accumulators
  // zeroed again, then the rest of the record.
  DeviceStats& out = table.out[job];
  volatile unsigned long long* added = bins;
  for (unsigned b = threadIdx.x; b < kBinadeCount; b += blockDim.x) {
    out.binades[b] = added[b];
    added[b] = 0;
  }
  if (threadIdx.x == 0) acc->arrived[job] = 0;
  finalize(table, job, part, gridDim.x);
  if (then.decides) {
    __syncthreads();  // thread 0's record is written; every thread has left the histogram's memory
    decide_after(table, job, then.decision, acc, reinterpret_cast<unsigned long long*>(&hist[0][0]));
  }
}

// max over the grid of (bits & kAbs): each block reduces its threads', then one atomicMax (exact).
__global__ void __launch_bounds__(kBlock) max_abs_bits_kernel(const float* v, std::size_t n, unsigned* out) {
  unsigned m = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {  // kUnroll loads in flight
    unsigned bits[kUnroll];
    for (unsigned k = 0; k < kUnroll; ++k) bits[k] = __float_as_uint(v[i + k * stride]);
    for (unsigned k = 0; k < kUnroll; ++k) m = max(m, bits[k] & kAbs);
  }
  for (; i < n; i += stride) m = max(m, __float_as_uint(v[i]) & kAbs);
  m = device::block_reduce(m, device::MaxUnsigned());
  if (threadIdx.x == 0 && m != 0) atomicMax(out, m);
}

void launch_stats(const StatsTable& table, unsigned blocks, BlockPartial* partials, Accumulators* acc,
                  const Store* store, const Then& then, const Columns* columns, cudaStream_t stream) {
  const dim3 grid(blocks, static_cast<unsigned>(table.count));
  if (columns != nullptr && columns->stride == 1)
    stats_partial_kernel<true, kColumnsUnitStride><<<grid, kBlock, 0, stream>>>(table, partials, acc, *store, then, *columns);
  else if (columns != nullptr)
    stats_partial_kernel<true, kColumns><<<grid, kBlock, 0, stream>>>(table, partials, acc, *store, then, *columns);
  else if (store != nullptr)
    stats_partial_kernel<true, kArray><<<grid, kBlock, 0, stream>>>(table, partials, acc, *store, then, Columns{});
  else
    stats_partial_kernel<false, kArray><<<grid, kBlock, 0, stream>>>(table, partials, acc, Store{}, then, Columns{});
  GS_CUDA_CHECK_LAUNCH();
}

// The key histogram holds one split per exponent field >= 1: two thresholds of a format inside one such
// binade, at different bits, would need two (none of lib/numeric's formats has them: a test goes over all).
void check_thresholds(const RoundThresholds& th, Format f) {
  for (int a = 1; a < kThresholds - 1; ++a)
    for (int b = a + 1; b < kThresholds - 1; ++b) {
      const std::uint32_t ta = threshold_bits(th, a), tb = threshold_bits(th, b);
      const bool inside_a = ta >> 23 != 0 && (ta & 0x7FFFFFu) != 0, inside_b = tb >> 23 != 0 && (tb & 0x7FFFFFu) != 0;
      GS_CHECK(!(inside_a && inside_b && ta >> 23 == tb >> 23 && ta != tb),
               "cuda::tensor_stats: " << format_name(f) << "'s rounding thresholds 0x" << std::hex << ta << " and 0x"
                                      << tb << " share a binade; the statistics kernel splits a binade once");
    }
}

void check_jobs(const char* entry, const StatsJob* jobs, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    GS_CHECK(jobs[i].data != nullptr || jobs[i].n == 0,
             "cuda::" << entry << ": tensor " << i << " of " << jobs[i].n << " elements is null");
    GS_CHECK(jobs[i].n <= kMaxElements,
             "cuda::" << entry << ": tensor " << i << " has " << jobs[i].n << " elements, more than 2^40");
  }
}

// The statistics of `count` tensors (at most kJobsPerLaunch when `store` is given) into out[0..count).
void launch_tensor_stats(CudaContext& ctx, const StatsJob* jobs, std::size_t count, DeviceStats* out,
                         const Store* store, const Then& then = {}, const Columns* columns = nullptr) {
  // Every field of out[j] is written by its tensor's last block: no fill first (Accumulators).
  auto* acc = static_cast<Accumulators*>(ctx.zeroed_scratch(sizeof(Accumulators)));
  for (std::size_t first = 0; first < count; first += kJobsPerLaunch) {
    StatsTable table{};
    table.count = static_cast<int>(std::min<std::size_t>(kJobsPerLaunch, count - first));
    table.out = out + first;
    std::size_t largest = 0;
    for (int j = 0; j < table.count; ++j) {
      const StatsJob& job = jobs[first + static_cast<std::size_t>(j)];
      table.data[j] = job.data;
      table.n[j] = job.n;
      table.thresholds[j] = round_thresholds(job.format, job.round);
      check_thresholds(table.thresholds[j], job.format);
      largest = std::max(largest, job.n);
    }
    const unsigned blocks = grid_for(largest, kValuesPerThread, kMaxBlocksPerJob);
    auto* partials = static_cast<BlockPartial*>(
        ctx.scratch(static_cast<std::size_t>(table.count) * blocks * sizeof(BlockPartial)));
    launch_stats(table, blocks, partials, acc, store, then, columns, ctx.stream());
  }
}

}  // namespace

void tensor_stats(CudaContext& ctx, const StatsJob* jobs, std::size_t count, DeviceStats* out) {
  if (count == 0) return;
  GS_CHECK(jobs != nullptr && out != nullptr,
           "cuda::tensor_stats of " << count << " tensors got a null pointer");
  check_jobs("tensor_stats", jobs, count);
  launch_tensor_stats(ctx, jobs, count, out, nullptr);
}

namespace {

// tensor_stats with a decision: what the decision reads is among the `count` tensors.
void check_decision(const StatsDecision& then, std::size_t count) {
  GS_CHECK(count <= static_cast<std::size_t>(kMaxDecisionJobs),
           "cuda::tensor_stats with a decision: " << count << " tensors (at most " << kMaxDecisionJobs << ")");
  bool outs = then.kind != StatsDecision::kWeightGradScaleEach ? then.out != nullptr : count >= 1;
  for (std::size_t k = 0; then.kind == StatsDecision::kWeightGradScaleEach && k < count; ++k)
    outs = outs && then.outs[k] != nullptr;
  GS_CHECK(outs && (then.in != nullptr || then.kind == StatsDecision::kLossScale),
           "cuda::tensor_stats with a decision got a null scale entry");
  const auto given = [count](int j) { return j >= 0 && static_cast<std::size_t>(j) < count; };
  switch (then.kind) {
    case StatsDecision::kLocalScale:
      GS_CHECK(!rule_reads_moments(then.rule.formula) || (given(then.grad) && given(then.weight)),
               "cuda::tensor_stats: formula " << then.rule.formula << " reads the moments of g and W");
      GS_CHECK(!rule_reads_upstream(then.rule.formula) || given(then.upstream),
               "cuda::tensor_stats: formula " << then.rule.formula << " reads the upstream statistics");
      GS_CHECK((then.grad < 0 || given(then.grad)) && (then.weight < 0 || given(then.weight)) &&
                   (then.upstream < 0 || given(then.upstream)),
               "cuda::tensor_stats: a decision reads a tensor that is not among the " << count << " given");
      break;
    case StatsDecision::kWeightGradScale:
    case StatsDecision::kWeightGradScaleEach:
    case StatsDecision::kLossScale:
      GS_CHECK(count >= 1 && (then.kind != StatsDecision::kLossScale || count == 1),
               "cuda::tensor_stats: decision " << then.kind << " on " << count << " tensors");
      break;
  }
}

}  // namespace

void tensor_stats(CudaContext& ctx, const StatsJob* jobs, std::size_t count, DeviceStats* out,
                  const StatsDecision& then) {
  check_decision(then, count);
  if (count == 0) {  // a formula that reads nothing: the decision alone
    decide_local_scale(then.rule, nullptr, nullptr, nullptr, then.in, then.out, ctx.stream());
    return;
  }
  GS_CHECK(jobs != nullptr && out != nullptr, "cuda::tensor_stats of " << count << " tensors got a null pointer");
  check_jobs("tensor_stats", jobs, count);
  launch_tensor_stats(ctx, jobs, count, out, nullptr, Then{true, then});
}

void col2im_measured(CudaContext& ctx, const float* cols, const ConvGeometry& g, ColumnLayout layout, float* gx,
                     Format f, RoundOptions round, DeviceStats* out, const StatsDecision* then) {
  check_conv_geometry(g, "col2im_measured");
  if (then != nullptr) check_decision(*then, 1);
  const std::int64_t n = g.n * g.channels * g.h * g.w;
  GS_CHECK(out != nullptr && (n == 0 || (cols != nullptr && gx != nullptr)),
           "cuda::col2im_measured got a null pointer");
  const StatsJob job{gx, static_cast<std::size_t>(n), f, round};
  check_jobs("col2im_measured", &job, 1);
  Columns columns;
  columns.cols = cols;
  columns.channels = g.channels;
  columns.plane = g.h * g.w;
  columns.k = static_cast<int>(g.kernel);
  columns.stride = static_cast<int>(g.stride);
  columns.pad = static_cast<int>(g.pad);
  columns.w = static_cast<int>(g.w);
  columns.ho = static_cast<int>(g.ho());
  columns.wo = static_cast<int>(g.wo());
  columns.cs = column_strides(g, layout);
  Store store;  // the sums as they are: no multiplier, no rounding
  store.dst = gx;
  launch_tensor_stats(ctx, &job, 1, out, &store, then != nullptr ? Then{true, *then} : Then{}, &columns);
}

void measure_and_round(CudaContext& ctx, const StatsJob& job, const StoredRounding& stored, DeviceStats* out) {
  GS_CHECK(out != nullptr && (stored.dst != nullptr || job.n == 0),
           "cuda::measure_and_round of " << job.n << " elements got a null pointer");
  check_jobs("measure_and_round", &job, 1);
  const bool rounds = stored.round && job.format != Format::fp32;
  const bool divides = stored.divide || stored.device_divisor != nullptr;
  GS_CHECK(!(divides && stored.master != nullptr),
           "cuda::measure_and_round: the stored values are divided or unscaled into a master, not both");
  if (const WeightGradDecision* r = stored.decides_r) {
    GS_CHECK(job.n <= one_block_values(), "cuda::measure_and_round: r decided in the rounding's launch needs at most "
                                              << one_block_values() << " values (one block), got " << job.n);
    GS_CHECK(r->in != nullptr && r->out != nullptr, "cuda::measure_and_round: r's decision got a null scale entry");
  }
  if (stored.dst == job.data && !rounds && stored.multiplier == 1.0f && stored.device_multiplier == nullptr &&
      stored.master == nullptr && !divides && stored.decides_r == nullptr) {
    launch_tensor_stats(ctx, &job, 1, out, nullptr);  // nothing to store: the values stay as they are
    return;
  }
  Store store;
  store.dst = stored.dst;
  store.multiplier = stored.multiplier;
  store.device_multiplier = stored.device_multiplier;
  store.rounding = device_rounding(rounds ? job.format : Format::fp32, job.round);
  if (stored.master != nullptr) {
    GS_CHECK(stored.found_inf != nullptr, "cuda::measure_and_round: an unscale into a master needs a found_inf flag");
    if (stored.device_scale == nullptr) {
      const auto s = static_cast<float>(stored.scale);  // the CPU divides by float(S) too
      GS_CHECK_NUMERIC(std::isfinite(s) && s > 0,
                       "cuda::measure_and_round: the unscale's scale must be finite and > 0 as a float, got "
                           << stored.scale);
    }
    store.master = stored.master;
    store.scale = static_cast<float>(stored.scale);
    store.device_scale = stored.device_scale;
    store.found_inf = stored.found_inf;
  }
  store.divide = stored.divide;
  store.divisor = stored.divisor;
  store.device_divisor = stored.device_divisor;
  if (const WeightGradDecision* r = stored.decides_r) {
    store.decides_r = r->out;
    store.r_in = r->in;
    store.u_max = r->u_max;
  }
  launch_tensor_stats(ctx, &job, 1, out, &store);
}

std::size_t one_block_values() { return static_cast<std::size_t>(kBlock) * kValuesPerThread; }

void max_abs_bits(const float* data, std::size_t n, unsigned* out, cudaStream_t stream) {
  GS_CHECK(out != nullptr && (data != nullptr || n == 0), "cuda::max_abs_bits of " << n << " values got a null pointer");
  GS_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(unsigned), stream));
  if (n == 0) return;
  max_abs_bits_kernel<<<grid_for(n, 8, kMaxBlocksPerJob), kBlock, 0, stream>>>(data, n, out);
  GS_CUDA_CHECK_LAUNCH();
}

float max_abs_of_bits(unsigned bits) {
  if (bits >= kInf) return std::numeric_limits<float>::infinity();
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void tensor_stats(CudaContext& ctx, const float* data, std::size_t n, Format f, RoundOptions opt,
                  DeviceStats* out) {
  const StatsJob job{data, n, f, opt};
  tensor_stats(ctx, &job, 1, out);
}

TensorStats to_tensor_stats(const DeviceStats& d) {
  TensorStats s;
  s.zero = d.zero;
  s.underflow = d.underflow;
  s.subnormal = d.subnormal;
  s.normal = d.normal;
  s.overflow = d.overflow;
  s.nonfinite = d.nonfinite;
  s.elements = d.elements;
  s.count = d.count;
  s.sum = d.sum;
  s.sum_squares = d.sum_squares;
  s.min = d.min;
  s.max = d.max;
  s.max_abs = d.max_abs;
  s.min_nonzero_abs = d.min_nonzero_abs;
  for (int b = 0; b < kBinadeCount; ++b) s.binades[static_cast<std::size_t>(b)] = d.binades[b];
  return s;
}

std::vector<TensorStats> download_stats(CudaContext& ctx, const DeviceStats* out, std::size_t count) {
  std::vector<DeviceStats> host(count);
  if (count != 0) {
    GS_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), out, count * sizeof(DeviceStats), cudaMemcpyDeviceToHost, ctx.stream()));
    ctx.synchronize();
  }
  std::vector<TensorStats> s;
  s.reserve(count);
  for (const DeviceStats& d : host) s.push_back(to_tensor_stats(d));
  return s;
}

}  // namespace gradscale::cuda
