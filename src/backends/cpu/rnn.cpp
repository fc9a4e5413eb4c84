// CPU kernels of the rnn family (ops/rnn.cpp): lstm, gru, rnn and rnn_grad. Each direction's
// input projection over every step is one GEMM (oneDNN's sgemm for f32, loops for f64); each
// step then runs the recurrent GEMM and the gate math of every batch row. The backward pass
// walks the steps in reverse, collects the gradients of the gate inputs of every step, and
// finishes dx, dw and the input biases with one GEMM (or sum) each. Half types run as f32.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/small_gemm.h"
#include "ops/rnn_params.h"
#include "ops/rnn_util.h"

namespace kiln::cpu {

namespace {
namespace rm = rnn_math;

// C (M x N, row-major, leading dim ldc) = alpha * op(A) · op(B) + beta * C, with op(A) M x K
// and op(B) K x N; ta/tb: the row-major buffer holds the transpose.
template <typename T>
void gemm(const KernelContext& ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    // a small step's recurrent product (a few rows times the gates) on this thread, instead of
    // a library call that costs more than its arithmetic
    if (!ta && !tb && K > 0 && M * N * K <= kSmallGemm)
      return small_gemm_nn(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (K > 0) {
      const dnnl_status_t st =
          dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      if (st != dnnl_success)
        fail<UnsupportedError>("[{}] oneDNN sgemm failed ({}x{}x{}, status {})", ctx.op_name(), M,
                               N, K, static_cast<int>(st));
      return;
    }
  }
  const int64_t grain =
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, N * std::max<int64_t>(K, 1)));
  ctx.parallel_for(M, grain, [&](int64_t m0, int64_t m1) {
    std::vector<T> acc(static_cast<size_t>(N));
    for (int64_t m = m0; m < m1; ++m) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t k = 0; k < K; ++k) {
        const T a = ta ? A[k * lda + m] : A[m * lda + k];
        if (a == T(0)) continue;
        if (!tb) {
          const T* b = B + k * ldb;
          for (int64_t n = 0; n < N; ++n) acc[n] += a * b[n];
        } else {
          for (int64_t n = 0; n < N; ++n) acc[n] += a * B[n * ldb + k];
        }
      }
      T* c = C + m * ldc;
      for (int64_t n = 0; n < N; ++n) c[n] = alpha * acc[n] + (beta == T(0) ? T(0) : beta * c[n]);
    }
  });
}

// Everything a kernel of a layer reads, with the positions of the optional inputs.
template <typename T>
struct Layer {
  int cell = 0;
  int64_t T_ = 0, B = 0, I = 0, H = 0, D = 1, G = 1, S = 0;
  bool bf = false, reverse_only = false, lbr = false, input_forget = false;
  T clip = 0;
  const rm::ActParams* acts = nullptr;  // the params' (RnnParams::acts)
  const T *x = nullptr, *w = nullptr, *r = nullptr, *b = nullptr, *h0 = nullptr, *c0 = nullptr,
          *p = nullptr;
  std::vector<int64_t> lens;
  int next = 3;  // the first input after the optional ones

  int64_t row(int64_t t, int64_t b_) const { return bf ? b_ * T_ + t : t * B + b_; }
  bool backward_dir(int64_t d) const { return reverse_only || d == 1; }
  // The time of step s of row b in direction d (s < lens[b]).
  int64_t time(int64_t d, int64_t s, int64_t b_) const {
    return backward_dir(d) ? lens[b_] - 1 - s : s;
  }
  const rm::ActParams& act(int64_t d, int k) const { return acts[d * rm::acts_per_dir(cell) + k]; }
  T* reserve_row(T* res, int64_t t, int64_t d, int64_t b_) const {
    return res + ((t * D + d) * B + b_) * S;
  }
};

template <typename T>
Layer<T> read_layer(const KernelContext& ctx, const RnnParams& a, int cell, bool grad) {
  Layer<T> l;
  l.cell = cell;
  l.bf = a.batch_first;
  const TensorView& x = ctx.in(0);
  l.T_ = x.shape[l.bf ? 1 : 0];
  l.B = x.shape[l.bf ? 0 : 1];
  l.I = x.shape[2];
  l.H = a.hidden_size;
  l.D = a.num_dirs;
  l.reverse_only = a.reverse_only;
  l.G = rm::gates_of(cell);
  l.S = rm::reserve_width(cell) * l.H;
  l.lbr = a.linear_before_reset;
  l.input_forget = a.input_forget;
  l.clip = static_cast<T>(a.clip);
  l.acts = a.acts.data();
  l.x = x.ptr<T>();
  l.w = ctx.in(1).ptr<T>();
  l.r = ctx.in(2).ptr<T>();
  int k = 3;
  if (!grad && a.has_b) l.b = ctx.in(k++).ptr<T>();
  l.lens.assign(static_cast<size_t>(l.B), l.T_);
  if (a.has_seq_lens) {
    const TensorView& s = ctx.in(k++);
    dispatch_index(s.dtype, ctx.op_name(), [&](auto v) {
      using I = decltype(v);
      for (int64_t i = 0; i < l.B; ++i) {
        const int64_t n = static_cast<int64_t>(s.ptr<I>()[i]);
        if (n < 0 || n > l.T_)
          fail<ValueError>("[{}] seq_lens[{}] = {} is outside [0, {}] (x shape {})", ctx.op_name(),
                           i, n, l.T_, str(x.shape));
        l.lens[static_cast<size_t>(i)] = n;
      }
    });
  }
  if (a.has_h0) l.h0 = ctx.in(k++).ptr<T>();
  if (cell == 0 && a.has_c0) l.c0 = ctx.in(k++).ptr<T>();
  if (cell == 0 && a.has_p) l.p = ctx.in(k++).ptr<T>();
  l.next = k;
  return l;
}

// ---- forward

// One row of an f32 LSTM step with the default activations (sigmoid, tanh, tanh; gates in ONNX's
// order i, o, f, c): pre-activations g + q, the gates through the vector sigmoid and tanh, the new
// cell and state; the reserve row (training) gets the pre-activations and the new cell, `kept`
// (its last H) the new state. False where the library has no vector functions (nothing written).
template <typename T> bool lstm_row_vectorized(const KernelContext& ctx, const T* g, const T* q,
                                               int64_t H, T* cs, T* hs, T* y, T* kept, T* rr,
                                               T* gates) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    float *u = gates, *a = u + 4 * H, *cnew = a + 4 * H, *tc = cnew + H;
    for (int64_t j = 0; j < 4 * H; ++j) u[j] = g[j] + q[j];
    if (!sigmoid_f32_vectorized(ctx, u, a, 3 * H) ||
        !tanh_f32_vectorized(ctx, u + 3 * H, a + 3 * H, H))
      return false;
    for (int64_t j = 0; j < H; ++j) cnew[j] = a[2 * H + j] * cs[j] + a[j] * a[3 * H + j];
    if (!tanh_f32_vectorized(ctx, cnew, tc, H)) return false;
    for (int64_t j = 0; j < H; ++j) {
      const float hn = a[H + j] * tc[j];
      cs[j] = cnew[j];
      hs[j] = hn;
      y[j] = hn;
    }
    if (rr) {
      std::copy(u, u + 4 * H, rr);
      std::copy(cnew, cnew + H, rr + 4 * H);
      std::copy(hs, hs + H, kept);
    }
    return true;
  }
}

// One row of an f32 GRU step with linear_before_reset and the default activations (sigmoid,
// tanh; gates in ONNX's order z, r, h): as lstm_row_vectorized.
template <typename T> bool gru_row_vectorized(const KernelContext& ctx, const T* g, const T* q,
                                              int64_t H, T* hs, T* y, T* kept, T* rr, T* gates) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    float *u = gates, *a = u + 3 * H;
    for (int64_t j = 0; j < 2 * H; ++j) u[j] = g[j] + q[j];
    if (!sigmoid_f32_vectorized(ctx, u, a, 2 * H)) return false;
    for (int64_t j = 0; j < H; ++j) u[2 * H + j] = g[2 * H + j] + a[H + j] * q[2 * H + j];
    if (!tanh_f32_vectorized(ctx, u + 2 * H, a + 2 * H, H)) return false;
    if (rr) {
      std::copy(u, u + 3 * H, rr);
      std::copy(q + 2 * H, q + 3 * H, rr + 3 * H);
    }
    for (int64_t j = 0; j < H; ++j) {
      const float z = a[j], hn = (1.f - z) * a[2 * H + j] + z * hs[j];
      hs[j] = hn;
      y[j] = hn;
    }
    if (rr) std::copy(hs, hs + H, kept);
    return true;
  }
}

template <typename T> void forward(KernelContext& ctx, int cell) {
  RnnParams spare;
  const RnnParams& prm = params_of(ctx, spare);
  const Layer<T> l = read_layer<T>(ctx, prm, cell, false);
  const int64_t T_ = l.T_, B = l.B, I = l.I, H = l.H, D = l.D, GH = l.G * H, rows = T_ * B;
  T* y = ctx.out(0).ptr<T>();
  T* hn = ctx.out(1).ptr<T>();
  T* cn = cell == 0 ? ctx.out(2).ptr<T>() : nullptr;
  const bool training = prm.training;
  T* res = training ? ctx.out(ctx.num_outputs() - 1).ptr<T>() : nullptr;
  std::fill(y, y + ctx.out(0).numel(), T(0));
  if (res) std::fill(res, res + ctx.out(ctx.num_outputs() - 1).numel(), T(0));

  // every step's input projection, both directions: (rows, D*GH) = x · W(D*GH, I)ᵀ + Wb
  std::vector<T> xw(static_cast<size_t>(rows * D * GH));
  gemm<T>(ctx, false, true, rows, D * GH, I, T(1), l.x, I, l.w, I, T(0), xw.data(), D * GH);
  if (l.b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < GH; ++j) xw[(i * D + d) * GH + j] += l.b[d * 2 * GH + j];

  // f32 steps whose recurrent product is small run it as A · B over R transposed (H, GH), made
  // once per direction (small_gemm_nn)
  const bool small = std::is_same_v<T, float> && B * GH * H <= kSmallGemm;
  auto direction = [&](int64_t d) {
    std::vector<T> h(static_cast<size_t>(B * H)), c(static_cast<size_t>(B * H)),
        hr(static_cast<size_t>(B * GH)), rh(static_cast<size_t>(B * H));
    std::vector<T> rt(small ? static_cast<size_t>(H * GH) : 0);
    // the vectorized gates' pre-activations and activations, 10 H per row
    std::vector<T> gates(std::is_same_v<T, float> && cell < 2 ? static_cast<size_t>(B * 10 * H)
                                                              : 0);
    const T* R = l.r + d * GH * H;
    const T* Rb = l.b ? l.b + d * 2 * GH + GH : nullptr;
    if (small)
      for (int64_t j = 0; j < GH; ++j)
        for (int64_t k = 0; k < H; ++k) rt[k * GH + j] = R[j * H + k];
    // hr[:, col:col + n] = h' · R[col:col + n]ᵀ (h' = h, or r ⊙ h for GRU's h gate)
    auto recurrent = [&](const T* hp, int64_t col, int64_t n, T* out) {
      if (small)
        gemm<T>(ctx, false, false, B, n, H, T(1), hp, H, rt.data() + col, GH, T(0), out, GH);
      else gemm<T>(ctx, false, true, B, n, H, T(1), hp, H, R + col * H, H, T(0), out, GH);
    };
    const T* P = l.p ? l.p + d * 3 * H : nullptr;
    if (l.h0)
      std::copy(l.h0 + d * B * H, l.h0 + (d + 1) * B * H, h.begin());
    else
      std::fill(h.begin(), h.end(), T(0));
    if (l.c0)
      std::copy(l.c0 + d * B * H, l.c0 + (d + 1) * B * H, c.begin());
    else
      std::fill(c.begin(), c.end(), T(0));
    const rm::ActParams &fa = l.act(d, 0), &ga = l.act(d, cell == 2 ? 0 : 1),
                        &ha = l.act(d, cell == 0 ? 2 : 0);
    // an f32 LSTM with the default activations, no clip and no peepholes: its gate math in
    // vector loops (the library's vector sigmoid and tanh) instead of one element at a time
    [[maybe_unused]] const bool vector_lstm =
        std::is_same_v<T, float> && cell == 0 && !P && !l.input_forget && l.clip <= T(0) &&
        fa.kind == rm::sigmoid && ga.kind == rm::tanh_ && ha.kind == rm::tanh_;
    [[maybe_unused]] const bool vector_gru = std::is_same_v<T, float> && cell == 1 && l.lbr &&
                                             l.clip <= T(0) && fa.kind == rm::sigmoid &&
                                             ga.kind == rm::tanh_;
    for (int64_t s = 0; s < T_; ++s) {
      // recurrent part: GRU without linear_before_reset takes z and r first, h after r
      const int64_t g_now = cell == 1 && !l.lbr ? 2 * H : GH;
      recurrent(h.data(), 0, g_now, hr.data());
      if (Rb)
        for (int64_t b_ = 0; b_ < B; ++b_)
          for (int64_t j = 0; j < g_now; ++j) hr[b_ * GH + j] += Rb[j];
      if (cell == 1 && !l.lbr) {
        // (r ⊙ H) · Rhᵀ: r first
        for (int64_t b_ = 0; b_ < B; ++b_) {
          const bool on = s < l.lens[b_];
          const T* g = xw.data() + (l.row(on ? l.time(d, s, b_) : 0, b_) * D + d) * GH;
          for (int64_t j = 0; j < H; ++j) {
            const T ur = g[H + j] + hr[b_ * GH + H + j];
            rh[b_ * H + j] = rm::activate(fa, rm::clip_gate(ur, l.clip)) * h[b_ * H + j];
          }
        }
        recurrent(rh.data(), 2 * H, H, hr.data() + 2 * H);
        if (Rb)
          for (int64_t b_ = 0; b_ < B; ++b_)
            for (int64_t j = 0; j < H; ++j) hr[b_ * GH + 2 * H + j] += Rb[2 * H + j];
      }
      // (rows in parallel: vectorized, only where a row's gate math outweighs waking the pool)
      const int64_t grain = vector_lstm || vector_gru ? std::max<int64_t>(1, 16384 / GH) : 1;
      ctx.parallel_for(B, grain, [&](int64_t b0, int64_t b1) {
        for (int64_t b_ = b0; b_ < b1; ++b_) {
          if (s >= l.lens[b_]) continue;
          const int64_t t = l.time(d, s, b_);
          const T* g = xw.data() + (l.row(t, b_) * D + d) * GH;
          const T* q = hr.data() + b_ * GH;
          T* hs = h.data() + b_ * H;
          T* cs = c.data() + b_ * H;
          T* rr = res ? l.reserve_row(res, t, d, b_) : nullptr;
          if (vector_lstm &&
              lstm_row_vectorized(ctx, g, q, H, cs, hs, y + (l.row(t, b_) * D + d) * H,
                                  rr ? rr + l.S - H : nullptr, rr, gates.data() + b_ * 10 * H))
            continue;
          if (vector_gru &&
              gru_row_vectorized(ctx, g, q, H, hs, y + (l.row(t, b_) * D + d) * H,
                                 rr ? rr + l.S - H : nullptr, rr, gates.data() + b_ * 10 * H))
            continue;
          for (int64_t j = 0; j < H; ++j) {
            T hnew;
            if (cell == 0) {
              const T cp = cs[j];
              const T ui = g[j] + q[j] + (P ? P[j] * cp : T(0));
              const T uf = g[2 * H + j] + q[2 * H + j] + (P ? P[2 * H + j] * cp : T(0));
              const T uc = g[3 * H + j] + q[3 * H + j];
              const T ig = rm::activate(fa, rm::clip_gate(ui, l.clip));
              const T fg = l.input_forget ? T(1) - ig : rm::activate(fa, rm::clip_gate(uf, l.clip));
              const T cc = rm::activate(ga, rm::clip_gate(uc, l.clip));
              const T cnew = fg * cp + ig * cc;
              const T uo = g[H + j] + q[H + j] + (P ? P[H + j] * cnew : T(0));
              const T og = rm::activate(fa, rm::clip_gate(uo, l.clip));
              hnew = og * rm::activate(ha, cnew);
              cs[j] = cnew;
              if (rr) {
                rr[j] = ui;
                rr[H + j] = uo;
                rr[2 * H + j] = uf;
                rr[3 * H + j] = uc;
                rr[4 * H + j] = cnew;
              }
            } else if (cell == 1) {
              const T uz = g[j] + q[j], ur = g[H + j] + q[H + j];
              const T zg = rm::activate(fa, rm::clip_gate(uz, l.clip));
              const T rg = rm::activate(fa, rm::clip_gate(ur, l.clip));
              const T uh = l.lbr ? g[2 * H + j] + rg * q[2 * H + j] : g[2 * H + j] + q[2 * H + j];
              const T hc = rm::activate(ga, rm::clip_gate(uh, l.clip));
              hnew = (T(1) - zg) * hc + zg * hs[j];
              if (rr) {
                rr[j] = uz;
                rr[H + j] = ur;
                rr[2 * H + j] = uh;
                rr[3 * H + j] = l.lbr ? q[2 * H + j] : T(0);
              }
            } else {
              const T u = g[j] + q[j];
              hnew = rm::activate(fa, rm::clip_gate(u, l.clip));
              if (rr) rr[j] = u;
            }
            hs[j] = hnew;
            y[(l.row(t, b_) * D + d) * H + j] = hnew;
            if (rr) rr[l.S - H + j] = hnew;
          }
        }
      });
    }
    std::copy(h.begin(), h.end(), hn + d * B * H);
    if (cn) std::copy(c.begin(), c.end(), cn + d * B * H);
  };
  // small steps: the two directions of a bidirectional layer side by side, one thread each (a
  // step's rows are too few to share); larger ones in turn, each step's work shared
  ctx.parallel_for(D, small ? 1 : D, [&](int64_t d0, int64_t d1) {
    for (int64_t d = d0; d < d1; ++d) direction(d);
  });
}

// ---- backward

template <typename T> void backward(KernelContext& ctx) {
  RnnParams spare;
  const RnnParams& prm = params_of(ctx, spare);
  const int cell = prm.cell;
  const Layer<T> l = read_layer<T>(ctx, prm, cell, true);
  const int64_t T_ = l.T_, B = l.B, I = l.I, H = l.H, D = l.D, G = l.G, GH = G * H, rows = T_ * B;
  int k = l.next;
  const T* res = ctx.in(k++).ptr<T>();
  const T* dy = ctx.in(k++).ptr<T>();
  const T* dhn = ctx.in(k++).ptr<T>();
  const T* dcn = cell == 0 ? ctx.in(k++).ptr<T>() : nullptr;
  T* dx = ctx.out(0).ptr<T>();
  T* dw = ctx.out(1).ptr<T>();
  T* dr = ctx.out(2).ptr<T>();
  T* db = ctx.out(3).ptr<T>();
  T* dh0 = ctx.out(4).ptr<T>();
  T* dc0 = cell == 0 ? ctx.out(5).ptr<T>() : nullptr;
  T* dp = cell == 0 ? ctx.out(6).ptr<T>() : nullptr;
  for (int o = 0; o < ctx.num_outputs(); ++o)
    std::fill(ctx.out(o).ptr<T>(), ctx.out(o).ptr<T>() + ctx.out(o).numel(), T(0));

  std::vector<T> dg(static_cast<size_t>(rows * GH));  // d(gate inputs) of every step, x's rows
  std::vector<T> dgr(static_cast<size_t>(B * GH)), hp(static_cast<size_t>(B * H)),
      cp(static_cast<size_t>(B * H)), rhp(static_cast<size_t>(B * H)),
      dh(static_cast<size_t>(B * H)), dc(static_cast<size_t>(B * H)),
      dhp(static_cast<size_t>(B * H)), drh(static_cast<size_t>(B * H));
  for (int64_t d = 0; d < D; ++d) {
    const T* W = l.w + d * GH * I;
    const T* R = l.r + d * GH * H;
    const T* P = l.p ? l.p + d * 3 * H : nullptr;
    T* dR = dr + d * GH * H;
    T* dWb = db + d * 2 * GH;
    T* dRb = dWb + GH;
    T* dP = dp ? dp + d * 3 * H : nullptr;
    const rm::ActParams &fa = l.act(d, 0), &ga = l.act(d, cell == 2 ? 0 : 1),
                        &ha = l.act(d, cell == 0 ? 2 : 0);
    // an f32 LSTM with the default activations, no clip and no peepholes: its gate math in
    // vector loops (the library's vector sigmoid and tanh) instead of one element at a time
    std::fill(dg.begin(), dg.end(), T(0));
    std::copy(dhn + d * B * H, dhn + (d + 1) * B * H, dh.begin());
    if (dcn)
      std::copy(dcn + d * B * H, dcn + (d + 1) * B * H, dc.begin());
    else
      std::fill(dc.begin(), dc.end(), T(0));
    for (int64_t s = T_ - 1; s >= 0; --s) {
      // previous states of every running row (zeros for the others)
      for (int64_t b_ = 0; b_ < B; ++b_) {
        T* hrow = hp.data() + b_ * H;
        T* crow = cp.data() + b_ * H;
        if (s >= l.lens[b_]) {
          std::fill(hrow, hrow + H, T(0));
          std::fill(crow, crow + H, T(0));
        } else if (s == 0) {
          for (int64_t j = 0; j < H; ++j) {
            hrow[j] = l.h0 ? l.h0[(d * B + b_) * H + j] : T(0);
            crow[j] = l.c0 ? l.c0[(d * B + b_) * H + j] : T(0);
          }
        } else {
          const T* pr = l.reserve_row(const_cast<T*>(res), l.time(d, s - 1, b_), d, b_);
          std::copy(pr + l.S - H, pr + l.S, hrow);
          if (cell == 0) std::copy(pr + 4 * H, pr + 5 * H, crow);
        }
      }
      std::fill(dgr.begin(), dgr.end(), T(0));
      // phase 1: everything up to the recurrent GEMM (GRU without linear_before_reset stops at
      // the h gate, whose r needs (duh · Rh) first)
      ctx.parallel_for(B, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b_ = b0; b_ < b1; ++b_) {
          if (s >= l.lens[b_]) continue;
          const int64_t t = l.time(d, s, b_);
          const T* rr = l.reserve_row(const_cast<T*>(res), t, d, b_);
          const T* dyr = dy + (l.row(t, b_) * D + d) * H;
          T* g = dg.data() + l.row(t, b_) * GH;
          T* q = dgr.data() + b_ * GH;
          T* hps = hp.data() + b_ * H;
          T* cps = cp.data() + b_ * H;
          T* dhs = dh.data() + b_ * H;
          T* dcs = dc.data() + b_ * H;
          T* dhps = dhp.data() + b_ * H;
          for (int64_t j = 0; j < H; ++j) {
            const T dH = dhs[j] + dyr[j];
            if (cell == 0) {
              const T ui = rr[j], uo = rr[H + j], uf = rr[2 * H + j], uc = rr[3 * H + j],
                      cn = rr[4 * H + j], cpv = cps[j];
              const T ai = rm::clip_gate(ui, l.clip), ao = rm::clip_gate(uo, l.clip),
                      af = rm::clip_gate(uf, l.clip), ac = rm::clip_gate(uc, l.clip);
              const T ig = rm::activate(fa, ai), og = rm::activate(fa, ao),
                      fg = l.input_forget ? T(1) - ig : rm::activate(fa, af),
                      cc = rm::activate(ga, ac);
              const T duo =
                  dH * rm::activate(ha, cn) * rm::activate_grad(fa, ao) * rm::clip_pass(uo, l.clip);
              const T dC =
                  dcs[j] + dH * og * rm::activate_grad(ha, cn) + (P ? duo * P[H + j] : T(0));
              T di = dC * cc;
              const T dfg = dC * cpv;
              T duf = 0;
              if (l.input_forget)
                di -= dfg;
              else
                duf = dfg * rm::activate_grad(fa, af) * rm::clip_pass(uf, l.clip);
              const T dui = di * rm::activate_grad(fa, ai) * rm::clip_pass(ui, l.clip);
              const T duc = dC * ig * rm::activate_grad(ga, ac) * rm::clip_pass(uc, l.clip);
              dcs[j] = dC * fg + (P ? dui * P[j] + duf * P[2 * H + j] : T(0));
              g[j] = q[j] = dui;
              g[H + j] = q[H + j] = duo;
              g[2 * H + j] = q[2 * H + j] = duf;
              g[3 * H + j] = q[3 * H + j] = duc;
              dhps[j] = 0;
            } else if (cell == 1) {
              const T uz = rr[j], ur = rr[H + j], uh = rr[2 * H + j];
              const T az = rm::clip_gate(uz, l.clip), ar = rm::clip_gate(ur, l.clip),
                      ah = rm::clip_gate(uh, l.clip);
              const T zg = rm::activate(fa, az), rg = rm::activate(fa, ar),
                      hc = rm::activate(ga, ah);
              const T dz = dH * (hps[j] - hc);
              const T duh =
                  dH * (T(1) - zg) * rm::activate_grad(ga, ah) * rm::clip_pass(uh, l.clip);
              dhps[j] = dH * zg;
              g[j] = q[j] = dz * rm::activate_grad(fa, az) * rm::clip_pass(uz, l.clip);
              g[2 * H + j] = duh;
              if (l.lbr) {
                const T dr_ = duh * rr[3 * H + j];
                g[H + j] = q[H + j] = dr_ * rm::activate_grad(fa, ar) * rm::clip_pass(ur, l.clip);
                q[2 * H + j] = duh * rg;
              } else {
                q[2 * H + j] = duh;  // pairs with r ⊙ H in dRh; dr after the GEMM below
                rhp[b_ * H + j] = rg * hps[j];
              }
            } else {
              const T u = rr[j];
              const T a = rm::clip_gate(u, l.clip);
              g[j] = q[j] = dH * rm::activate_grad(fa, a) * rm::clip_pass(u, l.clip);
              dhps[j] = 0;
            }
          }
        }
      });
      if (cell == 1 && !l.lbr) {
        // d(r ⊙ H) = duh · Rh, then dr and the direct part of dH
        gemm<T>(ctx, false, false, B, H, H, T(1), dgr.data() + 2 * H, GH, R + 2 * H * H, H, T(0),
                drh.data(), H);
        for (int64_t b_ = 0; b_ < B; ++b_) {
          if (s >= l.lens[b_]) continue;
          const int64_t t = l.time(d, s, b_);
          const T* rr = l.reserve_row(const_cast<T*>(res), t, d, b_);
          T* g = dg.data() + l.row(t, b_) * GH;
          for (int64_t j = 0; j < H; ++j) {
            const T ur = rr[H + j], ar = rm::clip_gate(ur, l.clip), rg = rm::activate(fa, ar);
            const T drr = drh[b_ * H + j] * hp[b_ * H + j];
            dhp[b_ * H + j] += drh[b_ * H + j] * rg;
            g[H + j] = dgr[b_ * GH + H + j] =
                drr * rm::activate_grad(fa, ar) * rm::clip_pass(ur, l.clip);
          }
        }
        // dR: z and r rows pair with H, h rows with r ⊙ H
        gemm<T>(ctx, true, false, 2 * H, H, B, T(1), dgr.data(), GH, hp.data(), H, T(1), dR, H);
        gemm<T>(ctx, true, false, H, H, B, T(1), dgr.data() + 2 * H, GH, rhp.data(), H, T(1),
                dR + 2 * H * H, H);
        // dH_prev = direct + [dz, dr] · R_zr
        gemm<T>(ctx, false, false, B, H, 2 * H, T(1), dgr.data(), GH, R, H, T(1), dhp.data(), H);
      } else {
        gemm<T>(ctx, true, false, GH, H, B, T(1), dgr.data(), GH, hp.data(), H, T(1), dR, H);
        gemm<T>(ctx, false, false, B, H, GH, T(1), dgr.data(), GH, R, H, T(1), dhp.data(), H);
      }
      for (int64_t b_ = 0; b_ < B; ++b_) {
        if (s >= l.lens[b_]) continue;
        for (int64_t j = 0; j < GH; ++j) dRb[j] += dgr[b_ * GH + j];
        std::copy(dhp.begin() + b_ * H, dhp.begin() + (b_ + 1) * H, dh.begin() + b_ * H);
        if (dP) {
          const int64_t t = l.time(d, s, b_);
          const T* rr = l.reserve_row(const_cast<T*>(res), t, d, b_);
          const T* g = dg.data() + l.row(t, b_) * GH;
          for (int64_t j = 0; j < H; ++j) {
            dP[j] += g[j] * cp[b_ * H + j];
            dP[H + j] += g[H + j] * rr[4 * H + j];
            dP[2 * H + j] += g[2 * H + j] * cp[b_ * H + j];
          }
        }
      }
    }
    std::copy(dh.begin(), dh.end(), dh0 + d * B * H);
    if (dc0) std::copy(dc.begin(), dc.end(), dc0 + d * B * H);
    // x side: dx += dG · W, dW = dGᵀ · x, dWb = column sums of dG
    gemm<T>(ctx, false, false, rows, I, GH, T(1), dg.data(), GH, W, I, T(1), dx, I);
    gemm<T>(ctx, true, false, GH, I, rows, T(1), dg.data(), GH, l.x, I, T(0), dw + d * GH * I, I);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < GH; ++j) dWb[j] += dg[i * GH + j];
  }
}

template <int Cell>
void layer_kernel(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto v) { forward<decltype(v)>(ctx, Cell); });
}
void rnn_grad(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto v) { backward<decltype(v)>(ctx); });
}
}  // namespace

void register_rnn_kernels() {
  register_kernel(OpId::Lstm, Backend::cpu, {layer_kernel<0>, kFloatTypes});
  register_kernel(OpId::Gru, Backend::cpu, {layer_kernel<1>, kFloatTypes});
  register_kernel(OpId::Rnn, Backend::cpu, {layer_kernel<2>, kFloatTypes});
  register_kernel(OpId::RnnGrad, Backend::cpu, {rnn_grad, kFloatTypes});
}

}  // namespace kiln::cpu
