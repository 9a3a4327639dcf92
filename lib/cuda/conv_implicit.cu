// The implicit-GEMM convolution (see conv_implicit.h). The product is Y = W·X with M = out channels,
// N = n·Ho·Wo output positions and K = C·k² column rows, X never stored: a block owns an M-tile of kRows
// channels and an N-tile of kCols(kRows) positions (4096 outputs, 16 a thread in a 4×4 register tile)
// and walks K in slices of kSlice rows. Per slice, the block stages the weight tile and the input tile in
// shared memory — each input value gathered from x by the position and column row it stands for (0 in
// the padding) — and every thread adds its 16 products, one fused multiply-add each, row by row.
//
// - The tile over M is 16, 32 or 64 channels (the smallest that holds out_channels, at most 64), so a
//   layer of 16 channels does not compute 48 rows of zeros.
// - A thread's outputs are strided over the tile (channels tm + i·kRows/4, positions tn + j·kCols/4),
//   and a warp covers 4 values of tm by 8 of tn: each store instruction writes 4 full 32-byte sectors.
//   The tiles are kept in shared memory in the order the threads read them (a thread's 4 channels, and
//   its 4 positions, side by side), so a row's operands are two 16-byte loads per thread that a warp
//   serves in one pass each (4 and 8 distinct addresses).
// - The decomposition of a column row into (c, ki, kj) and its offset in a sample is computed once per
//   slice, by kSlice threads, into a table in shared memory (no division in the gather); the gather of
//   slice s + 1 is issued into registers before slice s is multiplied, so its latency overlaps the work.
#include "lib/cuda/conv_implicit.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/round.cuh"

namespace gradscale::cuda {
namespace {

constexpr int kThreads = 256;  // per block: 8 warps
constexpr int kMicro = 4;      // a thread's register tile is kMicro × kMicro outputs
constexpr int kSlice = 8;      // column rows staged per step

template <int kRows>
constexpr int kTileCols = kThreads * kMicro * kMicro / kRows;  // 256, 128 or 64 positions

// Column row k0 + r of a sample: its offset (c·h + ki)·w + kj from the sample's start, and ki, kj (for the
// bounds); a row past K is not `valid` and gathers 0.
struct RowInfo {
  int offset, ki, kj, valid;
};
__device__ __forceinline__ RowInfo row_info(std::int64_t kr, std::int64_t rows, int k, int h, int w) {
  if (kr >= rows) return {0, 0, 0, 0};
  const int r = static_cast<int>(kr), kk = k * k;
  const int c = r / kk, rest = r - c * kk, ki = rest / k, kj = rest - ki * k;
  return {(c * h + ki) * w + kj, ki, kj, 1};
}

// acc[i][j] += a_i·b_j for the first `rows` rows of the staged tiles, in row order (ws[r][tm] and
// xs[r][tn] hold a thread's 4 channels and 4 positions side by side).
template <int kRowVecs, int kColVecs>
__device__ __forceinline__ void multiply_rows(const float4 (&ws)[kSlice][kRowVecs], const float4 (&xs)[kSlice][kColVecs],
                                              int rows, int tm, int tn, float (&acc)[kMicro][kMicro]) {
  for (int r = 0; r < rows; ++r) {
    const float4 a = ws[r][tm], b = xs[r][tn];
    const float av[kMicro] = {a.x, a.y, a.z, a.w}, bv[kMicro] = {b.x, b.y, b.z, b.w};
    for (int i = 0; i < kMicro; ++i)
      for (int j = 0; j < kMicro; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kThreads)
    conv_forward_kernel(const float* x, ConvGeometry g, int ho, int wo, const float* w, int out_ch,
                        const float* bias, DeviceRounding rounding, float* y) {
  constexpr int kCols = kTileCols<kRows>;
  constexpr int kRowThreads = kRows / kMicro, kColThreads = kCols / kMicro;
  constexpr int kWarpCols = kColThreads / 8;            // warps side by side over the positions
  constexpr int kLoadRows = kSlice * kCols / kThreads;  // input-tile rows a thread gathers per slice
  constexpr int kLoadStep = kThreads / kCols;
  constexpr int kWeightLoads = (kRows * kSlice + kThreads - 1) / kThreads;
  // A thread's operands side by side: ws[r][tm] holds channels tm + i·kRowThreads, xs[r][tn] positions
  // tn + j·kColThreads (i, j = 0..3 as x, y, z, w).
  __shared__ float4 ws[kSlice][kRowThreads];
  __shared__ float4 xs[kSlice][kColThreads];
  __shared__ RowInfo info[2][kSlice];

  const int t = static_cast<int>(threadIdx.x), lane = t % 32, warp = t / 32;
  const int tm = (warp / kWarpCols) * 4 + lane / 8, tn = (warp % kWarpCols) * 8 + lane % 8;
  const int k = static_cast<int>(g.kernel), stride = static_cast<int>(g.stride), pad = static_cast<int>(g.pad),
            h = static_cast<int>(g.h), wd = static_cast<int>(g.w);
  const int plane = ho * wo;
  const std::int64_t K = g.channels * k * k, N = g.n * plane;
  const std::int64_t p0 = static_cast<std::int64_t>(blockIdx.x) * kCols;
  const int m0 = static_cast<int>(blockIdx.y) * kRows;

  // The slot of the input tile this thread gathers (consecutive threads, consecutive slots: no bank
  // conflict when it stores), the position that slot stands for, and where that position's patch starts.
  const int slot = t % kCols, lr = t / kCols;
  const std::int64_t lp = p0 + (slot % 4) * kColThreads + slot / 4;
  const bool gathers = lp < N;
  const float* xb = x;
  int ih0 = 0, iw0 = 0;
  if (gathers) {
    const std::int64_t b = lp / plane;
    const int q = static_cast<int>(lp - b * plane), oh = q / wo, ow = q - oh * wo;
    ih0 = oh * stride - pad;
    iw0 = ow * stride - pad;
    xb = x + b * g.channels * g.h * g.w + (static_cast<std::int64_t>(ih0) * wd + iw0);
  }
  float* const xs_flat = &xs[0][0].x;
  float* const ws_flat = &ws[0][0].x;

  float xv[kLoadRows], wv[kWeightLoads];
  const auto gather = [&](std::int64_t k0, const RowInfo* rows) {
    for (int l = 0; l < kLoadRows; ++l) {
      const RowInfo ri = rows[lr + l * kLoadStep];
      const int ih = ih0 + ri.ki, iw = iw0 + ri.kj;
      xv[l] = gathers && ri.valid && static_cast<unsigned>(ih) < static_cast<unsigned>(h) &&
                      static_cast<unsigned>(iw) < static_cast<unsigned>(wd)
                  ? xb[ri.offset]
                  : 0.0f;
    }
    for (int l = 0; l < kWeightLoads; ++l) {  // W[m0 + m][k0 + r] for the slot's channel m
      const int i = t + l * kThreads;
      if (i >= kRows * kSlice) break;
      const int r = i / kRows, s = i % kRows, m = (s % 4) * kRowThreads + s / 4;
      const std::int64_t kr = k0 + r;
      wv[l] = m0 + m < out_ch && kr < K ? w[static_cast<std::int64_t>(m0 + m) * K + kr] : 0.0f;
    }
  };

  float acc[kMicro][kMicro];
  for (int i = 0; i < kMicro; ++i)
    for (int j = 0; j < kMicro; ++j) acc[i][j] = 0.0f;

  if (t < 2 * kSlice) info[t / kSlice][t % kSlice] = row_info(t, K, k, h, wd);  // slices 0 and 1
  __syncthreads();
  gather(0, info[0]);
  for (std::int64_t k0 = 0, s = 0; k0 < K; k0 += kSlice, ++s) {
    for (int l = 0; l < kLoadRows; ++l) xs_flat[(lr + l * kLoadStep) * kCols + slot] = xv[l];
    for (int l = 0; l < kWeightLoads; ++l)
      if (t + l * kThreads < kRows * kSlice) ws_flat[t + l * kThreads] = wv[l];
    __syncthreads();
    // The next slice's gather in flight while this one is multiplied; then the table of the slice after.
    if (k0 + kSlice < K) gather(k0 + kSlice, info[(s + 1) % 2]);
    if (t < kSlice) info[s % 2][t] = row_info(k0 + 2 * kSlice + t, K, k, h, wd);
    // Only the rows that exist (a padding row would add +0 to every sum); a whole slice as a loop of
    // constant length, which the compiler unrolls.
    if (K - k0 >= kSlice)
      multiply_rows(ws, xs, kSlice, tm, tn, acc);
    else
      multiply_rows(ws, xs, static_cast<int>(K - k0), tm, tn, acc);
    __syncthreads();
  }

  // y[b][o][q] for position p = b·plane + q: the sample's part of the index once per position.
  std::int64_t at[kMicro];
  for (int j = 0; j < kMicro; ++j) {
    const std::int64_t p = p0 + tn + j * kColThreads, b = p / plane;
    at[j] = p < N ? b * out_ch * plane + (p - b * plane) : -1;
  }
  for (int i = 0; i < kMicro; ++i) {
    const int o = m0 + tm + i * kRowThreads;
    const float add = bias != nullptr && o < out_ch ? bias[o] : 0.0f;
    for (int j = 0; j < kMicro; ++j)
      if (o < out_ch && at[j] >= 0)
        y[at[j] + static_cast<std::int64_t>(o) * plane] =
            device::round_to_format(bias != nullptr ? acc[i][j] + add : acc[i][j], rounding);
  }
}

// ---- the upstream gradient ------------------------------------------------------------------------
// gx = col2im(Wᵀ·g) without the columns: a thread owns one input position (b, ih, iw) and kChannels
// channels c0 + ci, and walks the k² taps in (ki, kj) order; for a tap that reaches an output position
// (oh, ow), its column entry Σ_o W[o][c][ki][kj]·g[b][o][oh][ow] (o in order, one FMA each, from +0)
// is added to the channel's sum — the GEMM's entry and col2im's order (im2col.cuh), so on the CPU
// target the bits of gemm + col2im. The block's 256 positions are consecutive in memory, so a warp reads
// 32 consecutive output positions of g per (tap, o); W's values for the block's channels, the tap and
// kOutSlice channels of g are staged in shared memory, read as two 16-byte broadcasts per o.
constexpr int kChannels = 8;   // input channels a thread sums
constexpr int kOutSlice = 64;  // output channels staged per step

__global__ void conv_backward_input_kernel(const float* g, ConvGeometry geo, int ho, int wo, const float* w,
                                           int out_ch, float* gx) {
  __shared__ float4 ws[kOutSlice][kChannels / 4];
  const int t = static_cast<int>(threadIdx.x);
  const int k = static_cast<int>(geo.kernel), kk = k * k, stride = static_cast<int>(geo.stride),
            pad = static_cast<int>(geo.pad), h = static_cast<int>(geo.h), wd = static_cast<int>(geo.w);
  const int channels = static_cast<int>(geo.channels), plane_in = h * wd, plane_out = ho * wo;
  const int c0 = static_cast<int>(blockIdx.y) * kChannels;
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * kThreads + t;
  const bool owns = p < geo.n * plane_in;
  std::int64_t b = 0;
  int th = 0, tw = 0;  // ih + pad, iw + pad: = oh·stride + ki, ow·stride + kj
  if (owns) {
    b = p / plane_in;
    const int q = static_cast<int>(p - b * plane_in), ih = q / wd;
    th = ih + pad;
    tw = q - ih * wd + pad;
  }
  const float* gb = g + b * out_ch * static_cast<std::int64_t>(plane_out);
  const std::int64_t w_row = static_cast<std::int64_t>(channels) * kk;  // W[o] has C·k² values

  float sum[kChannels];
  for (int ci = 0; ci < kChannels; ++ci) sum[ci] = 0.0f;
  for (int ki = 0; ki < k; ++ki) {
    for (int kj = 0; kj < k; ++kj) {
      const int oh_s = th - ki, ow_s = tw - kj;
      const int oh = oh_s / stride, ow = ow_s / stride;
      const bool reaches = owns && oh_s >= 0 && ow_s >= 0 && oh_s == oh * stride && ow_s == ow * stride &&
                           oh < ho && ow < wo;
      const float* gp = gb + (reaches ? oh * wo + ow : 0);
      float part[kChannels];
      for (int ci = 0; ci < kChannels; ++ci) part[ci] = 0.0f;
      for (int o0 = 0; o0 < out_ch; o0 += kOutSlice) {
        const int outs = out_ch - o0 < kOutSlice ? out_ch - o0 : kOutSlice;
        __syncthreads();  // the previous slice's reads are done
        for (int i = t; i < kOutSlice * kChannels; i += kThreads) {  // W[o0 + o][c0 + ci][ki][kj]
          const int o = i / kChannels, ci = i % kChannels;
          float* dst = &ws[o][ci / 4].x + ci % 4;
          *dst = o < outs && c0 + ci < channels
                     ? w[static_cast<std::int64_t>(o0 + o) * w_row + static_cast<std::int64_t>(c0 + ci) * kk + ki * k + kj]
                     : 0.0f;
        }
        __syncthreads();
        if (reaches) {
          for (int o = 0; o < outs; ++o) {
            const float gv = gp[static_cast<std::int64_t>(o0 + o) * plane_out];
            const float4 a = ws[o][0], c = ws[o][1];
            part[0] = fmaf(a.x, gv, part[0]);
            part[1] = fmaf(a.y, gv, part[1]);
            part[2] = fmaf(a.z, gv, part[2]);
            part[3] = fmaf(a.w, gv, part[3]);
            part[4] = fmaf(c.x, gv, part[4]);
            part[5] = fmaf(c.y, gv, part[5]);
            part[6] = fmaf(c.z, gv, part[6]);
            part[7] = fmaf(c.w, gv, part[7]);
          }
        }
      }
      if (reaches)
        for (int ci = 0; ci < kChannels; ++ci) sum[ci] += part[ci];
    }
  }
  if (!owns) return;
  const int q = static_cast<int>(p - b * plane_in);
  for (int ci = 0; ci < kChannels; ++ci)
    if (c0 + ci < channels) gx[(b * channels + c0 + ci) * plane_in + q] = sum[ci];
}

template <int kRows>
void launch(const float* x, const ConvGeometry& g, const float* w, std::int64_t out_channels, const float* bias,
            float* y, const DeviceRounding& r, cudaStream_t stream) {
  const std::int64_t ho = g.ho(), wo = g.wo(), positions = g.n * ho * wo;
  const std::int64_t blocks_x = (positions + kTileCols<kRows> - 1) / kTileCols<kRows>;
  const std::int64_t blocks_y = (out_channels + kRows - 1) / kRows;
  GS_CHECK_SHAPE(blocks_x <= 2147483647 && blocks_y <= 65535,
                 "cuda::conv_forward_implicit: " << positions << " output positions of " << out_channels
                                                 << " channels do not fit one launch's grid");
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  conv_forward_kernel<kRows><<<grid, kThreads, 0, stream>>>(x, g, static_cast<int>(ho), static_cast<int>(wo), w,
                                                            static_cast<int>(out_channels), bias, r, y);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void conv_forward_implicit(const float* x, const ConvGeometry& g, const float* w, std::int64_t out_channels,
                           const float* bias, float* y, const DeviceRounding& rounding, cudaStream_t stream) {
  check_conv_geometry(g, "conv_forward_implicit");
  GS_CHECK_SHAPE(out_channels > 0 && out_channels <= 2147483647,
                 "cuda::conv_forward_implicit: " << out_channels << " output channels");
  constexpr std::int64_t kInt = 2147483647;
  GS_CHECK_SHAPE(g.channels * g.h * g.w <= kInt && g.col_rows() <= kInt,
                 "cuda::conv_forward_implicit: a sample of " << g.channels << " channels of " << g.h << "x"
                                                             << g.w << " (or its " << g.col_rows()
                                                             << " column rows) does not fit in 32-bit indices");
  if (g.n == 0) return;
  GS_CHECK(x != nullptr && w != nullptr && y != nullptr, "cuda::conv_forward_implicit got a null pointer");
  if (out_channels <= 16)
    launch<16>(x, g, w, out_channels, bias, y, rounding, stream);
  else if (out_channels <= 32)
    launch<32>(x, g, w, out_channels, bias, y, rounding, stream);
  else
    launch<64>(x, g, w, out_channels, bias, y, rounding, stream);
}

void conv_backward_input_implicit(const float* g, const ConvGeometry& geo, const float* w, std::int64_t out_channels,
                                  float* gx, cudaStream_t stream) {
  check_conv_geometry(geo, "conv_backward_input_implicit");
  GS_CHECK_SHAPE(out_channels > 0 && out_channels <= 2147483647,
                 "cuda::conv_backward_input_implicit: " << out_channels << " output channels");
  constexpr std::int64_t kInt = 2147483647;
  GS_CHECK_SHAPE(geo.channels <= kInt && geo.col_rows() <= kInt,
                 "cuda::conv_backward_input_implicit: " << geo.channels << " channels of a " << geo.kernel << "x"
                                                        << geo.kernel << " kernel do not fit in 32-bit indices");
  if (geo.n == 0) return;
  GS_CHECK(g != nullptr && w != nullptr && gx != nullptr, "cuda::conv_backward_input_implicit got a null pointer");
  const std::int64_t positions = geo.n * geo.h * geo.w;
  const std::int64_t blocks_x = (positions + kThreads - 1) / kThreads;
  const std::int64_t blocks_y = (geo.channels + kChannels - 1) / kChannels;
  GS_CHECK_SHAPE(blocks_x <= 2147483647 && blocks_y <= 65535,
                 "cuda::conv_backward_input_implicit: " << positions << " input positions of " << geo.channels
                                                        << " channels do not fit one launch's grid");
  conv_backward_input_kernel<<<dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y)), kThreads, 0,
                               stream>>>(g, geo, static_cast<int>(geo.ho()), static_cast<int>(geo.wo()), w,
                                         static_cast<int>(out_channels), gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace gradscale::cuda
