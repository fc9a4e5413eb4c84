// Device-side pieces of the CUDA recurrent kernels shared by rnn.cu (per-step kernels) and
// rnn_persistent.cu (one cooperative launch per direction): the geometry the kernels read, the
// activations, and the cell and gate-gradient math of one (batch row, unit). Included by .cu
// files only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "ops/rnn_util.h"

namespace kiln::cuda::rnn_detail {

namespace rm = rnn_math;

// What the device kernels read: dims, flags and the activations of the running direction.
struct Geo {
  int cell = 0;
  int64_t T = 0, B = 0, H = 0, D = 1, GH = 0, S = 0, d = 0;
  bool bf = false, rev = false, lbr = false, input_forget = false;
  double clip = 0;
  rm::ActParams fa, ga, ha;
  __device__ int64_t row(int64_t t, int64_t b) const { return bf ? b * T + t : t * B + b; }
  __device__ int64_t time(int64_t s, int64_t b, const int64_t* lens) const {
    return rev ? lens[b] - 1 - s : s;
  }
  __device__ int64_t res_off(int64_t t, int64_t b) const { return ((t * D + d) * B + b) * S; }
};

template <typename T>
__device__ T act(const rm::ActParams& a, T x) {
  return rm::activate(a, x);
}
template <typename T>
__device__ T act_grad(const rm::ActParams& a, T x) {
  return rm::activate_grad(a, x);
}

// One LSTM cell at unit j of a batch row: gate inputs x[q·H + j] + rec[q·H + j] for the gates
// i, o, f, c (plus the peepholes P on the previous and new cell), previous cell cp. Returns the
// new h, the new cell in *cn, and the reserve (ui, uo, uf, uc, cn) in rr when given.
template <typename T, typename Rec>
__device__ T lstm_cell(const Geo& g, const T* x, const Rec& q, const T* P, int64_t j, T cp, T* cn,
                       T* rr) {
  const int64_t H = g.H;
  const T clip = T(g.clip);
  const T ui = x[j] + q[j] + (P ? P[j] * cp : T(0));
  const T uf = x[2 * H + j] + q[2 * H + j] + (P ? P[2 * H + j] * cp : T(0));
  const T uc = x[3 * H + j] + q[3 * H + j];
  const T ig = act(g.fa, rm::clip_gate(ui, clip));
  const T fg = g.input_forget ? T(1) - ig : act(g.fa, rm::clip_gate(uf, clip));
  const T cc = act(g.ga, rm::clip_gate(uc, clip));
  const T c_new = fg * cp + ig * cc;
  const T uo = x[H + j] + q[H + j] + (P ? P[H + j] * c_new : T(0));
  *cn = c_new;
  if (rr) {
    rr[j] = ui;
    rr[H + j] = uo;
    rr[2 * H + j] = uf;
    rr[3 * H + j] = uc;
    rr[4 * H + j] = c_new;
  }
  return act(g.fa, rm::clip_gate(uo, clip)) * act(g.ha, c_new);
}

// One GRU cell at unit j: gate inputs x[q·H + j] + rec[q·H + j] for z, r, h (rbh: the h gate's
// recurrent bias, which r multiplies with linear_before_reset), previous h hp. Returns the new h
// and the reserve (uz, ur, uh, r's operand or 0) in rr when given.
template <typename T, typename Rec>
__device__ T gru_cell(const Geo& g, const T* x, const Rec& q, const T* rbh, int64_t j, T hp,
                      T* rr) {
  const int64_t H = g.H;
  const T clip = T(g.clip);
  const T uz = x[j] + q[j], ur = x[H + j] + q[H + j], qh = q[2 * H + j] + (rbh ? rbh[j] : T(0));
  const T zg = act(g.fa, rm::clip_gate(uz, clip)), rg = act(g.fa, rm::clip_gate(ur, clip));
  const T uh = g.lbr ? x[2 * H + j] + rg * qh : x[2 * H + j] + qh;
  if (rr) {
    rr[j] = uz;
    rr[H + j] = ur;
    rr[2 * H + j] = uh;
    rr[3 * H + j] = g.lbr ? qh : T(0);
  }
  return (T(1) - zg) * act(g.ga, rm::clip_gate(uh, clip)) + zg * hp;
}

// The gate gradients of one (batch row, unit j) at one step: dH (the carried dH_prev plus dy),
// the previous states hpv and cpv, the step's reserve rr. Writes the gate columns q·H + j of gg
// (dg at the row's time) and q (this step's dgr row), updates dc, sets dhp to the direct part of
// dH_prev, and (GRU without linear_before_reset) *rhp = r ⊙ H_prev. Shared by grad_gates_kernel
// and the persistent backward kernel.
template <typename T>
__device__ void grad_cell(const Geo& g, int64_t j, T dH, T hpv, T cpv, const T* rr, const T* P,
                          T* gg, T* q, T& dc, T& dhp, T* rhp) {
  const int64_t H = g.H;
  const T clip = T(g.clip);
  if (g.cell == 0) {
    const T ui = rr[j], uo = rr[H + j], uf = rr[2 * H + j], uc = rr[3 * H + j], cn = rr[4 * H + j];
    const T ai = rm::clip_gate(ui, clip), ao = rm::clip_gate(uo, clip),
            af = rm::clip_gate(uf, clip), ac = rm::clip_gate(uc, clip);
    const T ig = act(g.fa, ai), og = act(g.fa, ao), fg = g.input_forget ? T(1) - ig : act(g.fa, af),
            cc = act(g.ga, ac);
    const T duo = dH * act(g.ha, cn) * act_grad(g.fa, ao) * rm::clip_pass(uo, clip);
    const T dC = dc + dH * og * act_grad(g.ha, cn) + (P ? duo * P[H + j] : T(0));
    T di = dC * cc;
    const T dfg = dC * cpv;
    T duf = 0;
    if (g.input_forget)
      di -= dfg;
    else
      duf = dfg * act_grad(g.fa, af) * rm::clip_pass(uf, clip);
    const T dui = di * act_grad(g.fa, ai) * rm::clip_pass(ui, clip);
    const T duc = dC * ig * act_grad(g.ga, ac) * rm::clip_pass(uc, clip);
    dc = dC * fg + (P ? dui * P[j] + duf * P[2 * H + j] : T(0));
    gg[j] = q[j] = dui;
    gg[H + j] = q[H + j] = duo;
    gg[2 * H + j] = q[2 * H + j] = duf;
    gg[3 * H + j] = q[3 * H + j] = duc;
    dhp = 0;
  } else if (g.cell == 1) {
    const T uz = rr[j], ur = rr[H + j], uh = rr[2 * H + j];
    const T az = rm::clip_gate(uz, clip), ar = rm::clip_gate(ur, clip),
            ah = rm::clip_gate(uh, clip);
    const T zg = act(g.fa, az), rg = act(g.fa, ar), hc = act(g.ga, ah);
    const T dz = dH * (hpv - hc);
    const T duh = dH * (T(1) - zg) * act_grad(g.ga, ah) * rm::clip_pass(uh, clip);
    dhp = dH * zg;
    gg[j] = q[j] = dz * act_grad(g.fa, az) * rm::clip_pass(uz, clip);
    gg[2 * H + j] = duh;
    if (g.lbr) {
      gg[H + j] = q[H + j] = duh * rr[3 * H + j] * act_grad(g.fa, ar) * rm::clip_pass(ur, clip);
      q[2 * H + j] = duh * rg;
    } else {
      q[2 * H + j] = duh;
      *rhp = rg * hpv;
    }
  } else {
    const T u = rr[j];
    gg[j] = q[j] = dH * act_grad(g.fa, rm::clip_gate(u, clip)) * rm::clip_pass(u, clip);
    dhp = 0;
  }
}

template <typename T>
T* scratch_of(KernelContext& ctx, int64_t n) {
  return static_cast<T*>(ctx.scratch(sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1))));
}

}  // namespace kiln::cuda::rnn_detail
