// CUDA kernels of the rnn family (ops/rnn.cpp): lstm, gru, rnn and rnn_grad, every configuration
// the ops take (all activations, clip, peepholes, input_forget, both GRU variants, lengths), as
// the CPU kernels compute them: one GEMM for every step's input projection, then per step a
// recurrent GEMM and one gate kernel over (batch row, unit); the backward pass mirrors the CPU's.
// The GEMMs are plain one-thread-per-output kernels: simple and exact first. Inference layers in
// the configurations cuDNN supports run through cudnnRNNForward instead (see cudnn_supports).
// f32 LSTM layers and GRU layers with linear_before_reset outside cuDNN (training ones, and those
// with lengths or other options) run each direction's steps in one persistent cooperative kernel
// where the shapes allow: forward (rnn_persistent) by default, backward (rnn_backward_persistent,
// without peepholes) with KILN_RNN_PERSISTENT=1; KILN_RNN_PERSISTENT=0 keeps the per-step
// launches.
// Half types run as f32. seq_lens values outside [0, T] are reported through the step's error
// slot (the run then throws ValueError, as the CPU kernel does) and clamped so the kernels stay in
// bounds meanwhile.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/handles.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/library_check.h"
#include "backends/cuda/rnn_cells.cuh"
#include "backends/cuda/rnn_persistent.h"
#include "ops/rnn_params.h"
#include "ops/rnn_util.h"

namespace kiln::cuda {

void register_rnn_kernels();

namespace {
namespace rm = rnn_math;
using namespace rnn_detail;

#define KILN_RNN_LOOP(i, n)                                                 \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// C (M x N, ld ldc) = alpha * op(A) · op(B) + beta * C (row-major; ta/tb: stored transposed).
template <typename T>
__global__ void gemm_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                            int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  KILN_RNN_LOOP(idx, M * N) {
    const int64_t m = idx / N, n = idx % N;
    T acc = 0;
    for (int64_t k = 0; k < K; ++k)
      acc += (ta ? A[k * lda + m] : A[m * lda + k]) * (tb ? B[n * ldb + k] : B[k * ldb + n]);
    T* c = C + m * ldc + n;
    *c = alpha * acc + (beta == T(0) ? T(0) : beta * *c);
  }
}

// The calling thread's cuBLAS handle for the current device (destroyed with the thread).
cublasHandle_t blas_handle() {
  struct Handles {
    std::vector<cublasHandle_t> by_device;
    ~Handles() {
      for (auto h : by_device)
        if (h) cublasDestroy(h);
    }
  };
  thread_local Handles handles;
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  if (static_cast<int>(handles.by_device.size()) <= device)
    handles.by_device.resize(static_cast<size_t>(device) + 1, nullptr);
  cublasHandle_t& h = handles.by_device[static_cast<size_t>(device)];
  if (!h && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
    fail<DeviceError>("[rnn] cublasCreate failed on cuda:{}", device);
  return h;
}

// Row-major C = alpha op(A) op(B) + beta C through cuBLAS (column-major: C^T = op(B)^T op(A)^T).
// f32 stays f32 (cuBLAS's default math mode: no TF32).
template <typename T>
void gemm(cudaStream_t st, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const bool fits = std::max({M, N, K, lda, ldb, ldc}) <= INT_MAX;
  if (K <= 0 || !fits) {
    gemm_kernel<T><<<blocks_for(M * N), kThreads, 0, st>>>(ta, tb, M, N, K, alpha, A, lda, B,
                                                           ldb, beta, C, ldc);
    check_launch("rnn gemm");
    return;
  }
  cublasHandle_t h = blas_handle();
  if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS)
    fail<DeviceError>("[rnn] cublasSetStream failed");
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  cublasStatus_t r;
  if constexpr (std::is_same_v<T, double>)
    r = cublasDgemm(h, opb, opa, n, m, k, &alpha, B, static_cast<int>(ldb), A,
                    static_cast<int>(lda), &beta, C, static_cast<int>(ldc));
  else
    r = cublasSgemm(h, opb, opa, n, m, k, &alpha, B, static_cast<int>(ldb), A,
                    static_cast<int>(lda), &beta, C, static_cast<int>(ldc));
  if (r != CUBLAS_STATUS_SUCCESS) fail<DeviceError>("[rnn] cuBLAS gemm failed (status {})", static_cast<int>(r));
}

// Row-major P[c] = A[:, c·kc, (c+1)·kc) · op(B)[c·kc, (c+1)·kc), :] for c < splits (A: M x
// splits·kc with ld lda, B with ld ldb, stored transposed when tb; P[c] dense M x N, one after
// another): a split-K product whose partial sums the caller adds. Products with few output tiles
// and a long K (dH_prev = dG · R with K = G·H; h · Rᵀ at batch 64) would otherwise run on a
// handful of SMs.
template <typename T>
void gemm_split_k(cudaStream_t st, bool tb, int64_t M, int64_t N, int64_t kc, int splits,
                  const T* A, int64_t lda, const T* B, int64_t ldb, T* P) {
  cublasHandle_t h = blas_handle();
  if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS)
    fail<DeviceError>("[rnn] cublasSetStream failed");
  const T one = 1, zero = 0;
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(kc);
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const long long stride_b = tb ? kc : kc * ldb;
  cublasStatus_t r;
  if constexpr (std::is_same_v<T, double>)
    r = cublasDgemmStridedBatched(h, opb, CUBLAS_OP_N, n, m, k, &one, B, static_cast<int>(ldb),
                                  stride_b, A, static_cast<int>(lda), kc, &zero, P, n, M * N,
                                  splits);
  else
    r = cublasSgemmStridedBatched(h, opb, CUBLAS_OP_N, n, m, k, &one, B, static_cast<int>(ldb),
                                  stride_b, A, static_cast<int>(lda), kc, &zero, P, n, M * N,
                                  splits);
  if (r != CUBLAS_STATUS_SUCCESS)
    fail<DeviceError>("[rnn] cuBLAS batched gemm failed (status {})", static_cast<int>(r));
}

// out[j] += Σ_i a[i, j] for the row-major (rows, n) matrix a, through cuBLAS (ones: rows ones;
// the 64-bit API takes sizes past INT_MAX).
template <typename T>
void add_col_sums(cudaStream_t st, const T* a, int64_t rows, int64_t n, const T* ones, T* out) {
  cublasHandle_t h = blas_handle();
  if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS)
    fail<DeviceError>("[rnn] cublasSetStream failed");
  const T one = 1;
  cublasStatus_t r;
  if constexpr (std::is_same_v<T, double>)
    r = cublasDgemv_64(h, CUBLAS_OP_N, n, rows, &one, a, n, ones, 1, &one, out, 1);
  else
    r = cublasSgemv_64(h, CUBLAS_OP_N, n, rows, &one, a, n, ones, 1, &one, out, 1);
  if (r != CUBLAS_STATUS_SUCCESS)
    fail<DeviceError>("[rnn] cuBLAS gemv failed (status {})", static_cast<int>(r));
}

template <typename I>
__global__ void lens_kernel(const I* in, int64_t* out, int64_t B, int64_t T, int64_t* errors) {
  KILN_RNN_LOOP(b, B) {
    const int64_t v = in ? static_cast<int64_t>(in[b]) : T;
    if (v < 0 || v > T) report_bad_value(errors, b, v);
    out[b] = v < 0 ? 0 : v > T ? T : v;
  }
}

// xw += the input bias, and the recurrent bias of the first `fold` gate columns: every column
// whose recurrent bias adds straight to the gate (all but the h gate of a GRU with
// linear_before_reset, where r multiplies it).
template <typename T>
__global__ void add_bias_kernel(T* xw, const T* b, int64_t rows, int64_t D, int64_t GH,
                                int64_t fold) {
  KILN_RNN_LOOP(i, rows * D * GH) {
    const int64_t j = i % GH, d = (i / GH) % D;
    xw[i] += b[d * 2 * GH + j] + (j < fold ? b[d * 2 * GH + GH + j] : T(0));
  }
}

// GRU without linear_before_reset: rh = r ⊙ H (r from this step's gate inputs).
template <typename T>
__global__ void gru_rh_kernel(Geo g, int64_t s, const int64_t* lens, const T* xw, const T* hr,
                              const T* h, T* rh) {
  KILN_RNN_LOOP(i, g.B * g.H) {
    const int64_t b = i / g.H, j = i % g.H;
    const bool on = s < lens[b];
    const T* x = xw + (g.row(on ? g.time(s, b, lens) : 0, b) * g.D + g.d) * g.GH;
    const T ur = x[g.H + j] + hr[b * g.GH + g.H + j];
    rh[i] = act(g.fa, rm::clip_gate(ur, T(g.clip))) * h[i];
  }
}

// The recurrent products of one batch row: the sum of `n` split-K partials `stride` apart.
template <typename T> struct Parts {
  const T* p;
  int n;
  int64_t stride;
  __device__ T operator[](int64_t k) const {
    T v = p[k];
    for (int c = 1; c < n; ++c) v += p[c * stride + k];
    return v;
  }
};

template <typename T>
__global__ void gates_kernel(Geo g, int64_t s, const int64_t* lens, const T* xw, const T* hr,
                             int splits, const T* P, const T* rbh, T* h, T* c, T* y, T* res) {
  KILN_RNN_LOOP(i, g.B * g.H) {
    const int64_t b = i / g.H, j = i % g.H, H = g.H;
    if (s >= lens[b]) continue;
    const int64_t t = g.time(s, b, lens);
    const T* x = xw + (g.row(t, b) * g.D + g.d) * g.GH;
    const Parts<T> q{hr + b * g.GH, splits, g.B * g.GH};
    T* rr = res ? res + g.res_off(t, b) : nullptr;
    const T clip = T(g.clip);
    T hnew;
    if (g.cell == 0) {
      T cn;
      hnew = lstm_cell(g, x, q, P, j, c[i], &cn, rr);
      c[i] = cn;
    } else if (g.cell == 1) {
      hnew = gru_cell(g, x, q, rbh, j, h[i], rr);
    } else {
      const T u = x[j] + q[j];
      hnew = act(g.fa, rm::clip_gate(u, clip));
      if (rr) rr[j] = u;
    }
    h[i] = hnew;
    y[(g.row(t, b) * g.D + g.d) * H + j] = hnew;
    if (rr) rr[g.S - H + j] = hnew;
  }
}

struct Inputs {
  int64_t T = 0, B = 0, I = 0, H = 0, D = 1, G = 1;
  bool bf = false, reverse_only = false, lbr = false, input_forget = false, training = false;
  double clip = 0;
  const rm::ActParams* acts = nullptr;  // the params' (RnnParams::acts)
  int b = -1, lens = -1, h0 = -1, c0 = -1, p = -1, next = 3;
};

Inputs read_inputs(const KernelContext& ctx, const RnnParams& a, int cell, bool grad) {
  Inputs in;
  in.bf = a.batch_first;
  const Shape& xs = ctx.in(0).shape;
  in.T = xs[in.bf ? 1 : 0];
  in.B = xs[in.bf ? 0 : 1];
  in.I = xs[2];
  in.H = a.hidden_size;
  in.D = a.num_dirs;
  in.reverse_only = a.reverse_only;
  in.G = rm::gates_of(cell);
  in.lbr = a.linear_before_reset;
  in.input_forget = a.input_forget;
  in.training = a.training;
  in.clip = a.clip;
  in.acts = a.acts.data();
  int k = 3;
  if (!grad && a.has_b) in.b = k++;
  if (a.has_seq_lens) in.lens = k++;
  if (a.has_h0) in.h0 = k++;
  if (cell == 0 && a.has_c0) in.c0 = k++;
  if (cell == 0 && a.has_p) in.p = k++;
  in.next = k;
  return in;
}

Geo geo_of(const Inputs& in, int cell, int64_t d) {
  Geo g;
  g.cell = cell;
  g.T = in.T;
  g.B = in.B;
  g.H = in.H;
  g.D = in.D;
  g.GH = in.G * in.H;
  g.S = rm::reserve_width(cell) * in.H;
  g.d = d;
  g.bf = in.bf;
  g.rev = in.reverse_only || d == 1;
  g.lbr = in.lbr;
  g.input_forget = in.input_forget;
  g.clip = in.clip;
  const int per = rm::acts_per_dir(cell);
  g.fa = in.acts[d * per];
  g.ga = in.acts[d * per + (cell == 2 ? 0 : 1)];
  g.ha = in.acts[d * per + (cell == 0 ? 2 : 0)];
  return g;
}

int64_t* device_lens(KernelContext& ctx, const Inputs& in) {
  auto* lens = static_cast<int64_t*>(ctx.scratch(sizeof(int64_t) * std::max<int64_t>(in.B, 1)));
  cudaStream_t st = stream_of(ctx);
  if (in.lens >= 0) {
    describe_errors(ctx, ErrorKind::sequence_length, 0, in.T);
    dispatch_index(ctx.in(in.lens).dtype, ctx.op_name(), [&](auto v) {
      using I = decltype(v);
      lens_kernel<I><<<blocks_for(in.B), kThreads, 0, st>>>(ctx.in(in.lens).ptr<I>(), lens, in.B,
                                                            in.T, ctx.error_slot());
    });
  } else {
    lens_kernel<int32_t><<<blocks_for(in.B), kThreads, 0, st>>>(nullptr, lens, in.B, in.T, nullptr);
  }
  check_launch(ctx.op_name());
  return lens;
}

// ---- cuDNN (inference)

// cuDNN's cells are ONNX's with the default activations, no clip, peepholes or input_forget, the
// GRU with linear_before_reset, forward or bidirectional; lengths must be known on the host, so
// only layers without seq_lens. Training layers keep the kernels above (rnn_grad reads their
// reserve layout).
bool cudnn_supports(int cell, const Inputs& in) {
  if (in.training || in.lens >= 0 || in.p >= 0 || in.reverse_only || in.clip > 0 ||
      in.input_forget || (cell == 1 && !in.lbr) || in.T <= 0 || in.B <= 0 || in.I <= 0)
    return false;
  if (in.T > INT32_MAX || in.B > INT32_MAX || in.I > INT32_MAX || in.H > INT32_MAX) return false;
  const int per = rm::acts_per_dir(cell);
  for (int64_t d = 0; d < in.D; ++d)
    for (int k = 0; k < per; ++k) {
      const int kind = in.acts[d * per + k].kind;
      const int want = cell == 2 ? kind : (k == 0 ? rm::sigmoid : rm::tanh_);
      if (cell == 2 ? (kind != rm::tanh_ && kind != rm::relu) : kind != want) return false;
    }
  if (cell == 2 && in.D == 2 && in.acts[0].kind != in.acts[1].kind) return false;
  return true;
}

struct CudnnRnn {
  cudnnRNNDescriptor_t rnn = nullptr;
  cudnnDropoutDescriptor_t dropout = nullptr;
  cudnnRNNDataDescriptor_t x = nullptr, y = nullptr;
  cudnnTensorDescriptor_t h = nullptr, m = nullptr, b = nullptr;
  CudnnRnn() {
    KILN_CUDNN_CHECK(cudnnCreateRNNDescriptor(&rnn));
    KILN_CUDNN_CHECK(cudnnCreateDropoutDescriptor(&dropout));
    KILN_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&x));
    KILN_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&y));
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&h));
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&m));
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&b));
  }
  ~CudnnRnn() {
    cudnnDestroyTensorDescriptor(b);
    cudnnDestroyTensorDescriptor(m);
    cudnnDestroyTensorDescriptor(h);
    cudnnDestroyRNNDataDescriptor(y);
    cudnnDestroyRNNDataDescriptor(x);
    cudnnDestroyDropoutDescriptor(dropout);
    cudnnDestroyRNNDescriptor(rnn);
  }
  CudnnRnn(const CudnnRnn&) = delete;
  CudnnRnn& operator=(const CudnnRnn&) = delete;
};

__global__ void fill_lengths_kernel(int32_t* lens, int64_t B, int32_t T) {
  KILN_RNN_LOOP(b, B) lens[b] = T;
}

// kiln's gate block of each cuDNN linear layer (input side; recurrent ones repeat the order):
// cuDNN LSTM i, f, c, o and GRU r, z, h against kiln's LSTM i, o, f, c and GRU z, r, h.
int kiln_block(int cell, int lin) {
  static const int lstm[] = {0, 2, 3, 1}, gru[] = {1, 0, 2};
  return cell == 0 ? lstm[lin] : cell == 1 ? gru[lin] : 0;
}

template <typename T>
void forward_cudnn(KernelContext& ctx, int cell, const Inputs& in) {
  cudaStream_t st = stream_of(ctx);
  const cudnnHandle_t handle = cudnn_handle(ctx.device(), st);
  const cudnnDataType_t dt = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const int T_ = static_cast<int>(in.T), B = static_cast<int>(in.B), I = static_cast<int>(in.I),
            H = static_cast<int>(in.H), D = static_cast<int>(in.D), G = static_cast<int>(in.G);
  const cudnnRNNMode_t mode = cell == 0                     ? CUDNN_LSTM
                              : cell == 1                   ? CUDNN_GRU
                              : in.acts[0].kind == rm::relu ? CUDNN_RNN_RELU
                                                            : CUDNN_RNN_TANH;
  CudnnRnn d;
  KILN_CUDNN_CHECK(cudnnSetDropoutDescriptor(d.dropout, handle, 0.0f, nullptr, 0, 0));
  KILN_CUDNN_CHECK(cudnnSetRNNDescriptor_v8(
      d.rnn, CUDNN_RNN_ALGO_STANDARD, mode, CUDNN_RNN_DOUBLE_BIAS,
      D == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, dt,
      std::is_same_v<T, double> ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH, I, H, H, 1, d.dropout,
      CUDNN_RNN_PADDED_IO_ENABLED));
  const std::vector<int> host_lens(static_cast<size_t>(B), T_);
  const cudnnRNNDataLayout_t layout =
      in.bf ? CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED;
  KILN_CUDNN_CHECK(cudnnSetRNNDataDescriptor(d.x, dt, layout, T_, B, I, host_lens.data(), nullptr));
  KILN_CUDNN_CHECK(
      cudnnSetRNNDataDescriptor(d.y, dt, layout, T_, B, D * H, host_lens.data(), nullptr));
  const int hdims[3] = {D, B, H}, hstrides[3] = {B * H, H, 1};
  KILN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d.h, dt, 3, hdims, hstrides));

  // weights: kiln's blocks of H rows copied into cuDNN's packed space (zero biases when none)
  size_t wbytes = 0, work = 0, reserve = 0;
  KILN_CUDNN_CHECK(cudnnGetRNNWeightSpaceSize(handle, d.rnn, &wbytes));
  KILN_CUDNN_CHECK(
      cudnnGetRNNTempSpaceSizes(handle, d.rnn, CUDNN_FWD_MODE_INFERENCE, d.x, &work, &reserve));
  void* wspace = ctx.scratch(std::max<size_t>(wbytes, 1));
  void* workspace = ctx.scratch(std::max<size_t>(work, 1));
  KILN_CUDA_CHECK(cudaMemsetAsync(wspace, 0, wbytes, st));
  const T* w = ctx.in(1).ptr<T>();
  const T* r = ctx.in(2).ptr<T>();
  const T* bias = in.b >= 0 ? ctx.in(in.b).ptr<T>() : nullptr;
  const int64_t GH = static_cast<int64_t>(G) * H;
  for (int dir = 0; dir < D; ++dir)
    for (int lin = 0; lin < 2 * G; ++lin) {
      const bool rec = lin >= G;
      const int blk = kiln_block(cell, lin % G);
      void *maddr = nullptr, *baddr = nullptr;
      KILN_CUDNN_CHECK(cudnnGetRNNWeightParams(handle, d.rnn, dir, wbytes, wspace, lin, d.m, &maddr,
                                               d.b, &baddr));
      const int64_t cols = rec ? H : I;
      const T* src = (rec ? r + dir * GH * H : w + dir * GH * I) + blk * int64_t{H} * cols;
      if (maddr)
        KILN_CUDA_CHECK(
            cudaMemcpyAsync(maddr, src, sizeof(T) * H * cols, cudaMemcpyDeviceToDevice, st));
      if (baddr && bias)
        KILN_CUDA_CHECK(cudaMemcpyAsync(baddr, bias + dir * 2 * GH + (rec ? GH : 0) + blk * H,
                                        sizeof(T) * H, cudaMemcpyDeviceToDevice, st));
    }
  auto* dev_lens = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * B));
  fill_lengths_kernel<<<blocks_for(B), kThreads, 0, st>>>(dev_lens, B, T_);
  check_launch(ctx.op_name());
  const void* hx = in.h0 >= 0 ? ctx.in(in.h0).data : nullptr;
  const void* cx = in.c0 >= 0 ? ctx.in(in.c0).data : nullptr;
  void* cy = cell == 0 ? ctx.out(2).data : nullptr;
  KILN_CUDNN_CHECK(cudnnRNNForward(handle, d.rnn, CUDNN_FWD_MODE_INFERENCE, dev_lens, d.x,
                                   ctx.in(0).data, d.y, ctx.out(0).data, d.h, hx, ctx.out(1).data,
                                   d.h, cx, cy, wbytes, wspace, work, workspace, 0, nullptr));
}

template <typename T> void forward(KernelContext& ctx, int cell) {
  RnnParams spare;
  const Inputs in = read_inputs(ctx, params_of(ctx, spare), cell, false);
  if (cudnn_supports(cell, in)) return forward_cudnn<T>(ctx, cell, in);
  cudaStream_t st = stream_of(ctx);
  const int64_t T_ = in.T, B = in.B, I = in.I, H = in.H, D = in.D, GH = in.G * H, rows = T_ * B;
  for (int o = 0; o < ctx.num_outputs(); ++o)
    KILN_CUDA_CHECK(cudaMemsetAsync(ctx.out(o).data, 0, ctx.out(o).numel() * sizeof(T), st));
  if (B == 0) return;
  const bool training = in.training;
  T* y = ctx.out(0).ptr<T>();
  T* hn = ctx.out(1).ptr<T>();
  T* cn = cell == 0 ? ctx.out(2).ptr<T>() : nullptr;
  T* res = training ? ctx.out(ctx.num_outputs() - 1).ptr<T>() : nullptr;
  const T* x = ctx.in(0).ptr<T>();
  const T* w = ctx.in(1).ptr<T>();
  const T* r = ctx.in(2).ptr<T>();
  const T* bias = in.b >= 0 ? ctx.in(in.b).ptr<T>() : nullptr;
  const int64_t* lens = device_lens(ctx, in);
  T* xw = scratch_of<T>(ctx, rows * D * GH);
  T* h = scratch_of<T>(ctx, B * H);
  T* c = scratch_of<T>(ctx, B * H);
  // h · Rᵀ per step as a split-K product (see gemm_split_k); GRU without linear_before_reset
  // fills the h gate's columns with a second product and stays whole
  const bool gru_rh = cell == 1 && !in.lbr;
  const int splits = !gru_rh && H % 128 == 0 && std::max(B, GH) <= INT_MAX
                         ? static_cast<int>(std::min<int64_t>(H / 128, 4))
                         : 1;
  T* hr = scratch_of<T>(ctx, splits * B * GH);
  T* rh = scratch_of<T>(ctx, B * H);
  gemm<T>(st, false, true, rows, D * GH, I, T(1), x, I, w, I, T(0), xw, D * GH);
  // the recurrent bias joins the input bias, but for the h gate of a GRU with
  // linear_before_reset (r multiplies it: the gate kernel adds it)
  const bool gru_lbr = cell == 1 && in.lbr;
  if (bias && rows > 0) {
    add_bias_kernel<T><<<blocks_for(rows * D * GH), kThreads, 0, st>>>(xw, bias, rows, D, GH,
                                                                       gru_lbr ? 2 * H : GH);
    check_launch(ctx.op_name());
  }
  const size_t state_bytes = sizeof(T) * B * H;
  for (int64_t d = 0; d < D; ++d) {
    const Geo g = geo_of(in, cell, d);
    const T* R = r + d * GH * H;
    const T* rbh = bias && gru_lbr ? bias + d * 2 * GH + GH + 2 * H : nullptr;
    const T* P = in.p >= 0 ? ctx.in(in.p).ptr<T>() + d * 3 * H : nullptr;
    if (in.h0 >= 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(h, ctx.in(in.h0).ptr<T>() + d * B * H, state_bytes,
                                      cudaMemcpyDeviceToDevice, st));
    else
      KILN_CUDA_CHECK(cudaMemsetAsync(h, 0, state_bytes, st));
    if (in.c0 >= 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(c, ctx.in(in.c0).ptr<T>() + d * B * H, state_bytes,
                                      cudaMemcpyDeviceToDevice, st));
    else
      KILN_CUDA_CHECK(cudaMemsetAsync(c, 0, state_bytes, st));
    bool persistent = false;
    if constexpr (std::is_same_v<T, float>)
      persistent = rnn_persistent(ctx, g, lens, xw, R, P, rbh, h, c, y, res);
    for (int64_t s = 0; s < T_ && !persistent; ++s) {
      const int64_t g_now = gru_rh ? 2 * H : GH;
      if (splits > 1)
        gemm_split_k<T>(st, true, B, GH, H / splits, splits, h, H, R, H, hr);
      else
        gemm<T>(st, false, true, B, g_now, H, T(1), h, H, R, H, T(0), hr, GH);
      if (cell == 1 && !in.lbr) {
        gru_rh_kernel<T><<<blocks_for(B * H), kThreads, 0, st>>>(g, s, lens, xw, hr, h, rh);
        check_launch(ctx.op_name());
        gemm<T>(st, false, true, B, H, H, T(1), rh, H, R + 2 * H * H, H, T(0), hr + 2 * H, GH);
      }
      gates_kernel<T>
          <<<blocks_for(B * H), kThreads, 0, st>>>(g, s, lens, xw, hr, splits, P, rbh, h, c, y, res);
      check_launch(ctx.op_name());
    }
    KILN_CUDA_CHECK(cudaMemcpyAsync(hn + d * B * H, h, state_bytes, cudaMemcpyDeviceToDevice, st));
    if (cn)
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(cn + d * B * H, c, state_bytes, cudaMemcpyDeviceToDevice, st));
  }
}

// ---- backward

// Step s of the backward pass, one thread per (batch row, unit): the previous states (hp, cp, and
// hp_all at the row's time when given; zeros for rows not running), then the gate gradients into
// dg (all steps) and dgr (this step; zeros for rows not running; dgr_all too when given, at the
// row's time), dc, and the direct part of dH_prev in dhp.
// With `carry`, a running row first takes step s + 1's dH_prev as its dH: dhp plus the `used`
// split-K partial products in part (what carry_kernel does between steps otherwise).
template <typename T>
__global__ void grad_gates_kernel(Geo g, int64_t s, const int64_t* lens, const T* res, const T* dy,
                                  const T* P, const T* h0, const T* c0, T* hp, T* cp, T* hp_all,
                                  T* dh, T* dc, T* dg, T* dgr, T* dhp, T* rhp, bool carry,
                                  const T* part, int used, T* dgr_all) {
  KILN_RNN_LOOP(i, g.B * g.H) {
    const int64_t b = i / g.H, j = i % g.H, H = g.H;
    T* q = dgr + b * g.GH;
    if (s >= lens[b]) {
      hp[i] = cp[i] = T(0);
      for (int64_t k = j; k < g.GH; k += H) q[k] = T(0);
      continue;
    }
    if (carry && s + 1 < lens[b]) {
      T v = dhp[i];
      for (int c = 0; c < used; ++c) v += part[c * g.B * g.H + i];
      dh[i] = v;
    }
    const int64_t t = g.time(s, b, lens);
    {
      T hv = 0, cv = 0;
      if (s == 0) {
        if (h0) hv = h0[(g.d * g.B + b) * H + j];
        if (c0) cv = c0[(g.d * g.B + b) * H + j];
      } else {
        const T* pr = res + g.res_off(g.time(s - 1, b, lens), b);
        hv = pr[g.S - H + j];
        if (g.cell == 0) cv = pr[4 * H + j];
      }
      hp[i] = hv;
      cp[i] = cv;
      if (hp_all) hp_all[g.row(t, b) * H + j] = hv;
    }
    const T* rr = res + g.res_off(t, b);
    T* gg = dg + g.row(t, b) * g.GH;
    const T dH = dh[i] + dy[(g.row(t, b) * g.D + g.d) * H + j];
    grad_cell(g, j, dH, hp[i], cp[i], rr, P, gg, q, dc[i], dhp[i], rhp + i);
    if (dgr_all)
      for (int64_t k = j; k < g.GH; k += H) dgr_all[g.row(t, b) * g.GH + k] = q[k];
  }
}

// GRU without linear_before_reset, after drh = duh · Rh: dr and the direct part of dH_prev.
template <typename T>
__global__ void gru_reset_grad_kernel(Geo g, int64_t s, const int64_t* lens, const T* res,
                                      const T* hp, const T* drh, T* dg, T* dgr, T* dhp) {
  KILN_RNN_LOOP(i, g.B * g.H) {
    const int64_t b = i / g.H, j = i % g.H, H = g.H;
    if (s >= lens[b]) continue;
    const int64_t t = g.time(s, b, lens);
    const T* rr = res + g.res_off(t, b);
    const T ur = rr[H + j], ar = rm::clip_gate(ur, T(g.clip)), rg = act(g.fa, ar);
    dhp[i] += drh[i] * rg;
    const T v = drh[i] * hp[i] * act_grad(g.fa, ar) * rm::clip_pass(ur, T(g.clip));
    dg[g.row(t, b) * g.GH + H + j] = v;
    dgr[b * g.GH + H + j] = v;
  }
}

// Running rows take dH_prev as their carried dH: dhp plus the `splits` partial products in part.
// When given, the step's recurrent gate gradients go to dgr_all and r ⊙ H_prev to rhp_all, at the
// row's time (for dR's product over all steps).
template <typename T>
__global__ void carry_kernel(Geo g, int64_t s, const int64_t* lens, const T* dhp, const T* part,
                             int splits, T* dh, const T* dgr, T* dgr_all, const T* rhp,
                             T* rhp_all) {
  const int64_t n = g.B * g.H;
  KILN_RNN_LOOP(i, n) {
    const int64_t b = i / g.H, j = i % g.H;
    if (s >= lens[b]) continue;
    T v = dhp[i];
    for (int c = 0; c < splits; ++c) v += part[c * n + i];
    dh[i] = v;
    const int64_t row = g.row(g.time(s, b, lens), b);
    if (dgr_all)
      for (int64_t k = j; k < g.GH; k += g.H) dgr_all[row * g.GH + k] = dgr[b * g.GH + k];
    if (rhp_all) rhp_all[row * g.H + j] = rhp[i];
  }
}

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, T v) {
  KILN_RNN_LOOP(i, n) x[i] = v;
}

// Per gate row j: dRb += Σ_b dgr (running rows); LSTM peepholes too.
template <typename T>
__global__ void sums_kernel(Geo g, int64_t s, const int64_t* lens, const T* res, const T* dgr,
                            const T* dg, const T* cp, T* dRb, T* dP) {
  KILN_RNN_LOOP(j, g.GH) {
    T acc = 0, pacc = 0;
    const int64_t H = g.H;
    for (int64_t b = 0; b < g.B; ++b) {
      if (s >= lens[b]) continue;
      acc += dgr[b * g.GH + j];
      if (dP && j < 3 * H) {
        const int64_t t = g.time(s, b, lens);
        const T gv = dg[g.row(t, b) * g.GH + j];
        const int64_t u = j % H;
        pacc += j / H == 1 ? gv * res[g.res_off(t, b) + 4 * H + u] : gv * cp[b * H + u];
      }
    }
    dRb[j] += acc;
    if (dP && j < 3 * H) dP[j] += pacc;
  }
}

template <typename T> void backward(KernelContext& ctx) {
  RnnParams spare;
  const RnnParams& prm = params_of(ctx, spare);
  const int cell = prm.cell;
  const Inputs in = read_inputs(ctx, prm, cell, true);
  cudaStream_t st = stream_of(ctx);
  const int64_t T_ = in.T, B = in.B, I = in.I, H = in.H, D = in.D, GH = in.G * H, rows = T_ * B;
  for (int o = 0; o < ctx.num_outputs(); ++o)
    KILN_CUDA_CHECK(cudaMemsetAsync(ctx.out(o).data, 0, ctx.out(o).numel() * sizeof(T), st));
  if (B == 0) return;
  int k = in.next;
  const T* res = ctx.in(k++).ptr<T>();
  const T* dy = ctx.in(k++).ptr<T>();
  const T* dhn = ctx.in(k++).ptr<T>();
  const T* dcn = cell == 0 ? ctx.in(k++).ptr<T>() : nullptr;
  const T* x = ctx.in(0).ptr<T>();
  const T* w = ctx.in(1).ptr<T>();
  const T* r = ctx.in(2).ptr<T>();
  const T* h0 = in.h0 >= 0 ? ctx.in(in.h0).ptr<T>() : nullptr;
  const T* c0 = in.c0 >= 0 ? ctx.in(in.c0).ptr<T>() : nullptr;
  T* dx = ctx.out(0).ptr<T>();
  T* dw = ctx.out(1).ptr<T>();
  T* dr = ctx.out(2).ptr<T>();
  T* db = ctx.out(3).ptr<T>();
  T* dh0 = ctx.out(4).ptr<T>();
  T* dc0 = cell == 0 ? ctx.out(5).ptr<T>() : nullptr;
  T* dp = cell == 0 ? ctx.out(6).ptr<T>() : nullptr;
  const int64_t* lens = device_lens(ctx, in);
  T* dg = scratch_of<T>(ctx, rows * GH);
  T* dgr = scratch_of<T>(ctx, B * GH);
  T* hp = scratch_of<T>(ctx, B * H);
  T* cp = scratch_of<T>(ctx, B * H);
  T* rhp = scratch_of<T>(ctx, B * H);
  T* dh = scratch_of<T>(ctx, B * H);
  T* dc = scratch_of<T>(ctx, B * H);
  T* dhp = scratch_of<T>(ctx, B * H);
  T* drh = scratch_of<T>(ctx, B * H);
  const size_t state_bytes = sizeof(T) * B * H;
  const unsigned nb = blocks_for(B * H);
  // dR and the recurrent bias come after the loop as one product and one reduction over all steps
  // instead of a small product and a reduction per step: the previous states gathered in hp_all
  // (and r ⊙ H_prev in rhp_all for GRU without linear_before_reset), the recurrent gate gradients
  // in dgr_all (dg itself for LSTM and RNN, whose input and recurrent gate gradients agree).
  // LSTM peepholes keep the per-step sums.
  const bool late_dr = in.p < 0;
  const bool gru_rh = cell == 1 && !in.lbr;
  T* hp_all = late_dr ? scratch_of<T>(ctx, rows * H) : nullptr;
  T* dgr_all = late_dr && cell == 1 ? scratch_of<T>(ctx, rows * GH) : late_dr ? dg : nullptr;
  T* rhp_all = late_dr && gru_rh ? scratch_of<T>(ctx, rows * H) : nullptr;
  T* ones = scratch_of<T>(ctx, rows);
  fill_kernel<T><<<blocks_for(rows), kThreads, 0, st>>>(ones, rows, T(1));
  check_launch(ctx.op_name());
  // dH_prev = dgr · R as a split-K product (K = G·H is long, the B x H result small)
  const bool cublas_ok = std::max({B, H, GH}) <= INT_MAX;
  const int splits = cublas_ok && GH % 256 == 0 ? static_cast<int>(std::min<int64_t>(GH / 256, 8))
                                                 : 0;
  T* part = splits ? scratch_of<T>(ctx, splits * B * H) : nullptr;
  for (int64_t d = 0; d < D; ++d) {
    const Geo g = geo_of(in, cell, d);
    const T* W = w + d * GH * I;
    const T* R = r + d * GH * H;
    const T* P = in.p >= 0 ? ctx.in(in.p).ptr<T>() + d * 3 * H : nullptr;
    T* dR = dr + d * GH * H;
    T* dWb = db + d * 2 * GH;
    T* dRb = dWb + GH;
    T* dP = dp ? dp + d * 3 * H : nullptr;
    KILN_CUDA_CHECK(cudaMemsetAsync(dg, 0, sizeof(T) * std::max<int64_t>(rows * GH, 1), st));
    if (hp_all) KILN_CUDA_CHECK(cudaMemsetAsync(hp_all, 0, sizeof(T) * rows * H, st));
    if (dgr_all && dgr_all != dg)
      KILN_CUDA_CHECK(cudaMemsetAsync(dgr_all, 0, sizeof(T) * rows * GH, st));
    if (rhp_all) KILN_CUDA_CHECK(cudaMemsetAsync(rhp_all, 0, sizeof(T) * rows * H, st));
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(dh, dhn + d * B * H, state_bytes, cudaMemcpyDeviceToDevice, st));
    if (dcn)
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(dc, dcn + d * B * H, state_bytes, cudaMemcpyDeviceToDevice, st));
    else
      KILN_CUDA_CHECK(cudaMemsetAsync(dc, 0, state_bytes, st));
    // the carry of dH_prev between steps happens in the next step's gate kernel (and once after
    // the loop), except for GRU without linear_before_reset, whose reset gradient comes between
    const bool fuse_carry = !gru_rh;
    const int carry_used = gru_rh ? 0 : splits;
    T* gates_dgr_all = fuse_carry && dgr_all != dg ? dgr_all : nullptr;
    bool persistent = false;
    if constexpr (std::is_same_v<T, float>)
      persistent = late_dr && rnn_backward_persistent(ctx, g, lens, res, dy, h0, c0, R, P, dh,
                                                      dc, dg, dgr, gates_dgr_all, hp_all);
    for (int64_t s = T_ - 1; s >= 0 && !persistent; --s) {
      grad_gates_kernel<T><<<nb, kThreads, 0, st>>>(
          g, s, lens, res, dy, P, h0, c0, hp, cp, hp_all, dh, dc, dg, dgr, dhp, rhp,
          fuse_carry && s + 1 < T_, part, carry_used, gates_dgr_all);
      check_launch(ctx.op_name());
      int used = 0;
      if (gru_rh) {
        gemm<T>(st, false, false, B, H, H, T(1), dgr + 2 * H, GH, R + 2 * H * H, H, T(0), drh, H);
        gru_reset_grad_kernel<T><<<nb, kThreads, 0, st>>>(g, s, lens, res, hp, drh, dg, dgr, dhp);
        check_launch(ctx.op_name());
        if (!late_dr) {
          gemm<T>(st, true, false, 2 * H, H, B, T(1), dgr, GH, hp, H, T(1), dR, H);
          gemm<T>(st, true, false, H, H, B, T(1), dgr + 2 * H, GH, rhp, H, T(1),
                  dR + 2 * H * H, H);
        }
        gemm<T>(st, false, false, B, H, 2 * H, T(1), dgr, GH, R, H, T(1), dhp, H);
      } else {
        if (!late_dr) gemm<T>(st, true, false, GH, H, B, T(1), dgr, GH, hp, H, T(1), dR, H);
        if (splits) {
          gemm_split_k<T>(st, false, B, H, GH / splits, splits, dgr, GH, R, H, part);
          used = splits;
        } else {
          gemm<T>(st, false, false, B, H, GH, T(1), dgr, GH, R, H, T(1), dhp, H);
        }
      }
      if (!late_dr) {
        sums_kernel<T><<<blocks_for(GH), kThreads, 0, st>>>(g, s, lens, res, dgr, dg, cp, dRb, dP);
        check_launch(ctx.op_name());
      }
      if (!fuse_carry || s == 0) {
        carry_kernel<T><<<nb, kThreads, 0, st>>>(
            g, s, lens, dhp, part, used, dh, dgr,
            fuse_carry || dgr_all == dg ? nullptr : dgr_all, rhp, rhp_all);
        check_launch(ctx.op_name());
      }
    }
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(dh0 + d * B * H, dh, state_bytes, cudaMemcpyDeviceToDevice, st));
    if (dc0)
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(dc0 + d * B * H, dc, state_bytes, cudaMemcpyDeviceToDevice, st));
    if (late_dr) {
      if (gru_rh) {
        gemm<T>(st, true, false, 2 * H, H, rows, T(1), dgr_all, GH, hp_all, H, T(1), dR, H);
        gemm<T>(st, true, false, H, H, rows, T(1), dgr_all + 2 * H, GH, rhp_all, H, T(1),
                dR + 2 * H * H, H);
      } else {
        gemm<T>(st, true, false, GH, H, rows, T(1), dgr_all, GH, hp_all, H, T(1), dR, H);
      }
      add_col_sums<T>(st, dgr_all, rows, GH, ones, dRb);
    }
    gemm<T>(st, false, false, rows, I, GH, T(1), dg, GH, W, I, T(1), dx, I);
    gemm<T>(st, true, false, GH, I, rows, T(1), dg, GH, x, I, T(0), dw + d * GH * I, I);
    add_col_sums<T>(st, dg, rows, GH, ones, dWb);
  }
}

template <int Cell>
void layer_kernel(KernelContext& ctx) {
  const DType t = ctx.in(0).dtype;
  if (t == f64) return forward<double>(ctx, Cell);
  if (t == f32) return forward<float>(ctx, Cell);
  fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(t));
}
void rnn_grad(KernelContext& ctx) {
  const DType t = ctx.in(0).dtype;
  if (t == f64) return backward<double>(ctx);
  if (t == f32) return backward<float>(ctx);
  fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(t));
}
}  // namespace

void register_rnn_kernels() {
  // seq_lens outside [0, T] are reported (KernelContext::error_slot)
  const auto entry = [](KernelFn fn) {
    return KernelEntry{fn, kFloatTypes, 0, /*half_via_f32=*/true, /*reports_errors=*/true};
  };
  register_kernel(OpId::Lstm, Backend::cuda, entry(layer_kernel<0>));
  register_kernel(OpId::Gru, Backend::cuda, entry(layer_kernel<1>));
  register_kernel(OpId::Rnn, Backend::cuda, entry(layer_kernel<2>));
  register_kernel(OpId::RnnGrad, Backend::cuda, entry(rnn_grad));
}

}  // namespace kiln::cuda
