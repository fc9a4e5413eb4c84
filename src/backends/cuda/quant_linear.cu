// CUDA kernel of quantized_weight_linear: y = x · dequantize(w)ᵀ + bias with w (N, K) int8.
// For a few rows (inference batches) the product runs on the int8 weights: a block of 16 warps
// computes 32 rows x 8 columns, each warp over every 16th chunk of 32 k, which it copies into
// its own shared memory (cp.async, two stages: many loads in flight), a thread 4 rows x 2
// columns; each weight byte is dequantized in registers exactly as dequantize does, then the
// sums of the warps are added in shared memory. A quarter of the weight bytes are read and no
// f32 copy is written. For more rows the weights are dequantized into scratch and cuBLASLt runs
// the f32 product (linalg.cu), which then reuses each weight across many rows.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_util.cuh"
#include "backends/quant_math.h"
#include "ops/quant_params.h"

namespace kiln::cuda {

// linalg.cu: y (rows, N) = x (rows, K) · wᵀ (+ bias) through cuBLASLt
void linear_float(KernelContext& ctx, const void* x, const void* w, const void* bias, void* out,
                  int64_t rows, int64_t N, int64_t K, DType t, bool tf32);

namespace {

constexpr int kWarps = 16;            // of a block; warp v takes chunks of k v, v + 16, ...
constexpr int kRows = 32, kCols = 8;  // a block's outputs
constexpr int64_t kMaxRows = 64;      // more rows take the dequantized copy and cuBLASLt

struct WqlArgs {
  int64_t m, n, k;
  bool per_channel;
};

// f32(b) + 2^23 for the byte b of u selected by kByte (0..3): the byte under the exponent of
// 2^23, so one subtraction gives the integer exactly.
template <int kByte>
__device__ __forceinline__ float biased_byte(uint32_t u) {
  return __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, 0x7540u | kByte)));
}

// A warp's copy of one chunk of 32 k: x (32 rows, 32 k; rows padded by 4 floats, so that the
// rows a load instruction reads fall in different banks) and w (8 rows, 32 bytes).
constexpr int kChunk = 32, kXStride = kChunk + 4;
struct WarpStage {
  float x[kRows][kXStride];
  uint32_t w[kCols][kChunk / 4];
};
constexpr int kStages = 2;
constexpr size_t kWqlSmem = sizeof(WarpStage) * kStages * kWarps;

template <typename W>
__global__ void __launch_bounds__(kWarps * 32)
    wql_rows_kernel(const float* __restrict__ x, const W* __restrict__ w,
                    const float* __restrict__ sw, const W* __restrict__ zw,
                    const float* __restrict__ bias, float* __restrict__ y, WqlArgs g) {
  extern __shared__ __align__(16) unsigned char wql_smem[];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  WarpStage* stages = reinterpret_cast<WarpStage*>(wql_smem) + warp * kStages;
  const int64_t row0 = blockIdx.y * int64_t{kRows}, col0 = blockIdx.x * int64_t{kCols};
  const int chunks = static_cast<int>((g.k + kChunk - 1) / kChunk);
  // chunk c of this warp into stage st: x as 256 16-byte pieces (8 a lane), w as 64 words (2 a
  // lane); pieces past K are zeros (K is a multiple of 4); rows past the last are read again
  auto issue = [&](int c, int st) {
    if (c < chunks) {
      WarpStage& s = stages[st];
      const int64_t k0 = int64_t{c} * kChunk;
      for (int j = 0; j < 8; ++j) {
        const int piece = lane + 32 * j, r = piece / 8, seg = piece % 8;
        const int64_t k = k0 + seg * 4;
        const float* src = x + std::min(row0 + r, g.m - 1) * g.k;
        cp_async16(&s.x[r][seg * 4], k < g.k ? src + k : src, k < g.k ? 16 : 0);
      }
      for (int j = 0; j < 2; ++j) {
        const int word = lane + 32 * j, r = word / 8, q = word % 8;
        const int64_t k = k0 + q * 4;
        if (k < g.k)
          cp_async_ca<4>(&s.w[r][q], w + std::min(col0 + r, g.n - 1) * g.k + k);
        else
          s.w[r][q] = 0;  // (its x pieces are zeros: (0 - c) * s * 0 adds nothing)
      }
    }
    cp_async_commit();
  };
  // u8 bytes are q; i8 bytes flipped by 0x80 are q + 128. (q - zp) * s = (b + 2^23 - c) * s
  // with c = 2^23 + (128) + zp: both terms and their difference are exact in f32.
  constexpr float kOffset = std::is_same_v<W, int8_t> ? 8388608.0f + 128.0f : 8388608.0f;
  const int mq = (lane >> 2) * 4, np = (lane & 3) * 2;
  float s[2], c[2];
  for (int j = 0; j < 2; ++j) {
    const int64_t n = std::min(col0 + np + j, g.n - 1), ch = g.per_channel ? n : 0;
    s[j] = sw[ch];
    c[j] = kOffset + static_cast<float>(zw[ch]);
  }
  float acc[4][2] = {};
  issue(warp, 0);
  for (int c0 = warp, it = 0; c0 < chunks; c0 += kWarps, ++it) {
    issue(c0 + kWarps, (it + 1) % kStages);
    cp_async_wait<1>();
    __syncwarp();
    const WarpStage& st = stages[it % kStages];
#pragma unroll 4
    for (int q = 0; q < kChunk / 4; ++q) {
      float4 xv[4];
      for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const float4*>(&st.x[mq + i][q * 4]);
      for (int j = 0; j < 2; ++j) {
        uint32_t u = st.w[np + j][q];
        if constexpr (std::is_same_v<W, int8_t>) u ^= 0x80808080u;
        const float w0 = (biased_byte<0>(u) - c[j]) * s[j];
        const float w1 = (biased_byte<1>(u) - c[j]) * s[j];
        const float w2 = (biased_byte<2>(u) - c[j]) * s[j];
        const float w3 = (biased_byte<3>(u) - c[j]) * s[j];
        for (int i = 0; i < 4; ++i) {
          acc[i][j] = fmaf(xv[i].x, w0, acc[i][j]);
          acc[i][j] = fmaf(xv[i].y, w1, acc[i][j]);
          acc[i][j] = fmaf(xv[i].z, w2, acc[i][j]);
          acc[i][j] = fmaf(xv[i].w, w3, acc[i][j]);
        }
      }
    }
    __syncwarp();  // the next issue overwrites this stage
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its stages: their memory holds the partial sums
  auto* part = reinterpret_cast<float(*)[32 * 8]>(wql_smem);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) part[warp][lane * 8 + i * 2 + j] = acc[i][j];
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t >= 32 * 8) return;
  float sum = 0.0f;
  for (int v = 0; v < kWarps; ++v) sum += part[v][t];
  const int l = t / 8, i = (t % 8) / 2, j = t % 2;
  const int64_t m = row0 + (l >> 2) * 4 + i, n = col0 + (l & 3) * 2 + j;
  if (m < g.m && n < g.n) y[m * g.n + n] = bias ? sum + bias[n] : sum;
}

// Any K and alignment: a thread an output.
template <typename W>
__global__ void wql_simple_kernel(const float* __restrict__ x, const W* __restrict__ w,
                                  const float* __restrict__ sw, const W* __restrict__ zw,
                                  const float* __restrict__ bias, float* __restrict__ y,
                                  WqlArgs g) {
  const int64_t total = g.m * g.n;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    const int64_t r = t / g.n, j = t % g.n, ch = g.per_channel ? j : 0;
    float acc = 0.0f;
    for (int64_t i = 0; i < g.k; ++i)
      acc = fmaf(x[r * g.k + i], quant_math::dequantize_one(w[j * g.k + i], zw[ch], sw[ch]), acc);
    y[t] = bias ? acc + bias[j] : acc;
  }
}

// wf (N, K) = dequantize(w) as the dequantize kernel computes it.
template <typename W>
__global__ void wql_dequantize_kernel(const W* __restrict__ w, const float* __restrict__ sw,
                                      const W* __restrict__ zw, float* __restrict__ wf,
                                      WqlArgs g) {
  const int64_t total = g.n * g.k;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    const int64_t ch = g.per_channel ? t / g.k : 0;
    wf[t] = quant_math::dequantize_one(w[t], zw[ch], sw[ch]);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename W>
void run_wql(KernelContext& ctx, const WqlArgs& g) {
  const float* x = ctx.in(0).ptr<float>();
  const W* w = ctx.in(1).ptr<W>();
  const float* sw = ctx.in(2).ptr<float>();
  const W* zw = ctx.in(3).ptr<W>();
  const float* bias =
      params_of<QuantizedWeightLinearParams>(ctx).has_bias ? ctx.in(4).ptr<float>() : nullptr;
  float* y = ctx.out(0).ptr<float>();
  const cudaStream_t stream = stream_of(ctx);
  if (g.m > kMaxRows || g.k == 0) {
    float* wf = g.k == 0 ? nullptr : static_cast<float*>(ctx.scratch(g.n * g.k * sizeof(float)));
    if (wf) {
      wql_dequantize_kernel<W><<<blocks_for(g.n * g.k), kThreads, 0, stream>>>(w, sw, zw, wf, g);
      check_launch(ctx.op_name());
    }
    return linear_float(ctx, x, wf, bias, y, g.m, g.n, g.k, DType::f32, false);
  }
  if (g.k % 4 == 0 && aligned(x, 16) && aligned(w, 4)) {
    const dim3 grid(static_cast<unsigned>((g.n + kCols - 1) / kCols),
                    static_cast<unsigned>((g.m + kRows - 1) / kRows));
    allow_smem(wql_rows_kernel<W>, kWqlSmem);
    wql_rows_kernel<W><<<grid, kWarps * 32, kWqlSmem, stream>>>(x, w, sw, zw, bias, y, g);
  } else {
    wql_simple_kernel<W><<<blocks_for(g.m * g.n), kThreads, 0, stream>>>(x, w, sw, zw, bias, y, g);
  }
  check_launch(ctx.op_name());
}

void quantized_weight_linear(KernelContext& ctx) {
  const TensorView& w = ctx.in(1);
  WqlArgs g;
  g.n = w.shape[0];
  g.k = w.shape[1];
  if (ctx.out(0).numel() == 0) return;
  g.m = ctx.out(0).numel() / g.n;
  g.per_channel = ctx.in(2).numel() != 1;
  if (w.dtype == DType::i8)
    run_wql<int8_t>(ctx, g);
  else if (w.dtype == DType::u8)
    run_wql<uint8_t>(ctx, g);
  else
    fail<UnsupportedError>("[{}] cuda kernel got weights of {}", ctx.op_name(), name(w.dtype));
}

}  // namespace

void register_quant_linear_kernels() {
  register_kernel(OpId::QuantizedWeightLinear, Backend::cuda,
                  {quantized_weight_linear, DTypeSet{f32}, 0, false});
}

}  // namespace kiln::cuda
