// The conv family's attributes (conv, fused_conv, conv_transpose, conv_grad_weight;
// src/ops/conv.cpp documents them) decoded once into the struct their kernels read. (C++17: CUDA
// files include it.)
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/op_params.h"

namespace kiln {

struct ConvParams : OpParams {
  /// One value per spatial dim; pads holds the nd begins, then the nd ends.
  std::vector<int64_t> stride, dilation, pads;
  /// conv_transpose's (empty for the other ops).
  std::vector<int64_t> output_padding;
  /// conv_grad_weight's NCHW weight shape (O, C/groups, kernel...) (empty for the other ops).
  std::vector<int64_t> weight_shape;
  int64_t groups = 1;
  bool has_bias = false;
  /// fused_conv's epilogue: a last input added to the output, then relu (false for the others).
  bool has_residual = false, relu = false;
  /// fused_conv's other activations after the residual (the CPU's: prepare_cpu_convs and the
  /// channels_last pass there): attr activation "clip" (between act_min and act_max),
  /// "hardswish", "sigmoid" or "silu"; none where the attr is absent.
  enum class Act { none, clip, hardswish, sigmoid, silu } act = Act::none;
  double act_min = 0, act_max = 0;
  /// TF32 math may run it (the tf32 pass, CompileOptions::allow_tf32).
  bool tf32 = false;
  /// The weight (input 1) is a constant of the executable (CPU: prepare_cpu_convs), which the
  /// kernel may lay out for its primitive once and keep in `state`.
  bool const_weight = false;
  /// Layout channels_last with x NCHW (the CPU's conv of an image: nchw_x).
  bool nchw_x = false;

  /// The packed constant weight (made by decode: a spare struct a kernel declares for params_of
  /// costs no allocation).
  std::shared_ptr<KernelState> state;
  KernelState* kernel_state() const override { return state.get(); }

  int nd() const { return static_cast<int>(stride.size()); }

  static ConvParams decode(OpId op, const Attrs& a) {
    ConvParams p;
    p.state = std::make_shared<KernelState>();
    p.stride = a.ints("stride");
    p.dilation = a.ints("dilation");
    p.pads = a.ints("pads");
    p.groups = a.i("groups");
    if (a.has("output_padding")) p.output_padding = a.ints("output_padding");
    if (a.has("weight_shape")) p.weight_shape = a.ints("weight_shape");
    p.has_bias = a.b("has_bias", false);
    p.has_residual = a.b("has_residual", false);
    p.relu = a.b("relu", false);
    if (a.has("activation")) {
      const std::string& act = a.str("activation");
      p.act = act == "clip"        ? Act::clip
              : act == "hardswish" ? Act::hardswish
              : act == "sigmoid"   ? Act::sigmoid
              : act == "silu"      ? Act::silu
                                   : Act::none;
      if (p.act == Act::none || p.relu)
        fail<ValueError>("[{}] activation {} is not clip, hardswish, sigmoid or silu{}",
                         op_name(op), act, p.relu ? " (or comes with relu)" : "");
      if (p.act == Act::clip) {
        p.act_min = a.f("act_min");
        p.act_max = a.f("act_max");
      }
    }
    p.tf32 = a.b("tf32", false);
    p.const_weight = a.b("const_weight", false);
    p.nchw_x = a.b("nchw_x", false);
    const size_t nd = p.stride.size();
    if (p.dilation.size() != nd || p.pads.size() != 2 * nd ||
        (!p.output_padding.empty() && p.output_padding.size() != nd) || p.groups < 1)
      fail<ValueError>(
          "[{}] needs stride, dilation (one value per spatial dim), pads (two per "
          "dim) and groups >= 1, got {}",
          op_name(op), a.to_string());
    return p;
  }
};

}  // namespace kiln
