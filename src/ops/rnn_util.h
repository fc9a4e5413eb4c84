// The math of the recurrent ops (ops/rnn.cpp) shared by the CPU and CUDA kernels: activations
// and their derivatives, and the layout of the reserve output.
//
// Reserve (T, D, B, S): per step, direction and batch row, what the backward pass reads:
//   LSTM S = 6H: the unclipped inputs of the gates i, o, f, c (4H), then C', then H'
//   GRU  S = 5H: the unclipped inputs of z, r, h (3H), then q = H·Rhᵀ + Rbh (linear_before_reset;
//                else unused), then H'
//   RNN  S = 2H: the unclipped input of the gate (H), then H'
// Rows of steps a batch row does not run (t >= its length) are zeros.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KILN_RNN_HD __host__ __device__
#else
#define KILN_RNN_HD
#endif

namespace kiln::rnn_math {

using std::exp;
using std::fabs;
using std::log1p;
using std::tanh;

// Activation codes: the values of kiln::RnnActivationKind.
enum Act : int {
  sigmoid,
  tanh_,
  relu,
  affine,
  leaky_relu,
  thresholded_relu,
  scaled_tanh,
  hard_sigmoid,
  elu,
  softsign,
  softplus,
  kNumActs
};

struct ActParams {
  int kind = tanh_;
  double alpha = 0, beta = 0;
};

template <typename T>
KILN_RNN_HD inline T activate(const ActParams& a, T x) {
  const T al = static_cast<T>(a.alpha), be = static_cast<T>(a.beta);
  switch (a.kind) {
    case sigmoid:
      return T(1) / (T(1) + exp(-x));
    case tanh_:
      return tanh(x);
    case relu:
      return x > T(0) ? x : T(0);
    case affine:
      return al * x + be;
    case leaky_relu:
      return x >= T(0) ? x : al * x;
    case thresholded_relu:
      return x > al ? x : T(0);
    case scaled_tanh:
      return al * tanh(be * x);
    case hard_sigmoid: {
      const T v = al * x + be;
      return v < T(0) ? T(0) : v > T(1) ? T(1) : v;
    }
    case elu:
      return x >= T(0) ? x : al * (exp(x) - T(1));
    case softsign:
      return x / (T(1) + fabs(x));
    default:
      return (x > T(0) ? x : T(0)) + log1p(exp(-fabs(x)));  // softplus
  }
}

/// d activate / dx at x.
template <typename T>
KILN_RNN_HD inline T activate_grad(const ActParams& a, T x) {
  const T al = static_cast<T>(a.alpha), be = static_cast<T>(a.beta);
  switch (a.kind) {
    case sigmoid: {
      const T s = T(1) / (T(1) + exp(-x));
      return s * (T(1) - s);
    }
    case tanh_: {
      const T t = tanh(x);
      return T(1) - t * t;
    }
    case relu:
      return x > T(0) ? T(1) : T(0);
    case affine:
      return al;
    case leaky_relu:
      return x >= T(0) ? T(1) : al;
    case thresholded_relu:
      return x > al ? T(1) : T(0);
    case scaled_tanh: {
      const T t = tanh(be * x);
      return al * be * (T(1) - t * t);
    }
    case hard_sigmoid: {
      const T v = al * x + be;
      return v > T(0) && v < T(1) ? al : T(0);
    }
    case elu:
      return x >= T(0) ? T(1) : al * exp(x);
    case softsign: {
      const T d = T(1) + fabs(x);
      return T(1) / (d * d);
    }
    default:
      return T(1) / (T(1) + exp(-x));  // softplus
  }
}

/// The gate input after clipping (clip <= 0: none), and whether its gradient passes.
template <typename T>
KILN_RNN_HD inline T clip_gate(T x, T clip) {
  if (clip <= T(0)) return x;
  return x < -clip ? -clip : x > clip ? clip : x;
}
template <typename T>
KILN_RNN_HD inline T clip_pass(T x, T clip) {
  return clip <= T(0) || (x >= -clip && x <= clip) ? T(1) : T(0);
}

inline int gates_of(int cell) { return cell == 0 ? 4 : cell == 1 ? 3 : 1; }  // lstm gru rnn
inline int acts_per_dir(int cell) { return cell == 0 ? 3 : cell == 1 ? 2 : 1; }
inline int reserve_width(int cell) { return cell == 0 ? 6 : cell == 1 ? 5 : 2; }  // times H

}  // namespace kiln::rnn_math
