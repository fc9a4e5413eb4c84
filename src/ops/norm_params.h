// The norm family's attributes (src/ops/norm.cpp documents them) decoded once into the structs
// its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// softmax, log_softmax: the (resolved) axis the rows run along.
struct SoftmaxParams : OpParams {
  int64_t axis = 0;

  static SoftmaxParams decode(OpId, const Attrs& a) {
    SoftmaxParams p;
    p.axis = a.i("axis");
    return p;
  }
};

/// layer_norm, rms_norm, batch_norm, instance_norm, group_norm, batch_norm_train and
/// batch_norm_train_grad.
struct NormParams : OpParams {
  double eps = 0;
  /// Optional inputs after the fixed ones: the weight, then the bias.
  bool has_weight = false, has_bias = false;
  /// layer_norm, rms_norm: the first normalized dim (resolved).
  int64_t begin_axis = 0;
  /// group_norm: channel groups (1 for the other ops).
  int64_t groups = 1;

  static NormParams decode(OpId op, const Attrs& a) {
    NormParams p;
    p.eps = a.f("eps");
    p.has_weight = a.b("has_weight", false);
    p.has_bias = a.b("has_bias", false);
    if (op == OpId::LayerNorm || op == OpId::RmsNorm) p.begin_axis = a.i("begin_axis");
    if (op == OpId::GroupNorm) p.groups = a.i("groups");
    return p;
  }
};

/// dropout: drop probability p and the generator's seed (64 bits stored in an int64).
struct DropoutParams : OpParams {
  double p = 0;
  uint64_t seed = 0;

  static DropoutParams decode(OpId, const Attrs& a) {
    DropoutParams d;
    d.p = a.f("p");
    d.seed = static_cast<uint64_t>(a.i("seed"));
    return d;
  }
};

}  // namespace kiln
