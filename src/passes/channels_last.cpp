// channels_last: runs convolutions on NHWC data where that is their fast layout:
//   - 2-D int8 convolutions (quantized_conv) on every backend: the CPU's oneDNN int8 kernels read
//     and write NHWC without reorders; CUDA's im2col rows are contiguous (none for 1x1);
//   - on CUDA, 2-D f16/bf16 convolutions, and f32 ones that may use TF32 (attr tf32:
//     CompileOptions::allow_tf32) in programs without weight gradients (tf32_nhwc), with
//     symmetric pads: conv, and in training programs the
//     gradient convolutions conv_transpose (data) and conv_grad_weight (weights): cuDNN's
//     tensor-core kernels take NHWC data and (O, kh, kw, C/G) weights (constant weights are
//     permuted here, once; other weights by a transpose, once per value; a weight gradient comes
//     out (O, kh, kw, C/G) and is transposed back where an NCHW reader, the optimizer, meets it);
//   - in a CUDA program with such convolutions, also every 4-D batch_norm_train and
//     batch_norm_train_grad and 2-D max_pool_grad and adaptive_avg_pool_grad (the training ops
//     between them, which CUDA runs on NHWC data);
//   - on the CPU, 2-D f32 convs and conv_transposes (inference): oneDNN's brgemm kernels read
//     and write NHWC, and
//     NCHW data would be reordered in and out around each conv (one whose input is an NCHW image
//     of at most 4 channels reads it as it is: nchw_x); sums, means, maxima and minima of NHWC
//     values reduce them on NHWC (their axes moved).
// Each such node gets the attribute channels_last and the values between them stay NHWC: an op
// that does not care about layout (elementwise with same-shape or 0-d operands, on the CPU also
// 4-D operands that broadcast; per-tensor quantize and dequantize) runs on NHWC where a reader
// wants its output so, and where that moves fewer bytes through transposes; 2-D max pooling and
// adaptive average pooling of an NHWC value run on NHWC too (channels_last; on the CPU float
// data only), and on the CPU so do 4-D instance norm and pads with known pads (permuted). A
// transpose is inserted only where an NCHW reader (or an output of the program)
// meets an NHWC value, or the other way round, once per value; it is a reshape when only dims of
// size 1 move. On CUDA, an int8 conv whose x is the per-tensor quantize of a float image (at most
// 4 channels) read by it alone takes the image itself (quantize_x: no quantized copy and no
// transpose). A float conv read only by the add of a residual and/or a relu becomes one
// fused_conv with them as its epilogue.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "core/op_registry.h"
#include "ops/fused_elementwise.h"
#include "passes/conv_epilogue.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {

const std::vector<int64_t> kToNhwc{0, 2, 3, 1}, kToNchw{0, 3, 1, 2};

class Rewriter {
 public:
  Rewriter(const Program& p, Backend target)
      : p_(p),
        cuda_(target == Backend::cuda),
        tf32_(tf32_nhwc(p)),
        nchw_(p.graph.nodes.size()),
        nhwc_(p.graph.nodes.size()),
        readers_(p.graph.nodes.size()),
        is_output_(p.graph.nodes.size(), 0),
        read_as_nhwc_(p.graph.nodes.size(), -1),
        shuffled_(p.graph.nodes.size(), 0) {
    for (auto v : p.outputs) is_output_[v.node] = 1;
    for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
      const Node& n = p.graph.nodes[i];
      for (size_t k = 0; k < n.inputs.size(); ++k)
        readers_[n.inputs[k].node].push_back({static_cast<int32_t>(i), static_cast<int32_t>(k)});
    }
  }

  Program run() {
    const auto& nodes = p_.graph.nodes;
    std::vector<int32_t> fused_at(nodes.size(), -1);  // last node of an epilogue -> its conv
    std::vector<char> absorbed(nodes.size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      const Node& n = nodes[i];
      if (absorbed[i] && fused_at[i] < 0) continue;  // inside an epilogue, emitted at its end
      if (shuffled_[i]) continue;                    // a channel shuffle's, emitted whole
      if (fused_at[i] >= 0) {
        convert(fused_at[i], epilogues_[fused_at[i]]);
        continue;
      }
      if (wants_nhwc(n)) {
        // a float conv's add of a residual and relu run in its epilogue (fused_conv): emitted at
        // the last of them, when the residual exists
        if (n.op == OpId::Conv) {
          const Epilogue e = epilogue_of(id, absorbed);
          if (e.last >= 0) {
            epilogues_[id] = e;
            fused_at[e.last] = id;
            for (int32_t a : e.absorbed) absorbed[a] = 1;
            continue;
          }
        }
        convert(id, {});
      } else if (agnostic(n) && (read_as_nhwc(id) || inputs_nhwc(n)) && cheaper_as_nhwc(n)) {
        keep_nhwc(id);
      } else if ((pools_nhwc(n) || norm_nhwc(n)) && slot(nhwc_, n.inputs[0])) {
        convert(id, {});  // a pool or norm between NHWC values: no transposes around it
      } else if (pad_nhwc(n) && slot(nhwc_, n.inputs[0])) {
        pad_on_nhwc(id);
      } else if (auto axes = nhwc_axes(n)) {
        reduce_nhwc(id, *axes);
      } else if (channels_nhwc(n)) {
        channels_on_nhwc(id);
      } else if (auto end = channel_shuffle(id)) {
        shuffle_on_nhwc(id, *end);
      } else {
        copy(id);
      }
    }
    out_.outputs.clear();
    for (auto v : p_.outputs) out_.outputs.push_back(as_nchw(v));
    out_.num_returned = p_.num_returned;
    return std::move(out_);
  }

 private:
  using Slot = std::vector<std::optional<ValueRef>>;

  using Epilogue = ConvEpilogue;

  // The single reader of node id's output 0, or -1 (none, several, or an output of the program).
  int32_t sole_reader(int32_t id) const {
    if (readers_[id].size() != 1 || is_output_[id]) return -1;
    return readers_[id][0].first;
  }

  // (`taken`: nodes another conv's epilogue absorbed already, such as the add of two convs)
  Epilogue epilogue_of(int32_t conv, const std::vector<char>& taken) const {
    // (the CPU's post-ops take more activations than CUDA's relu epilogue)
    return conv_epilogue(
        p_, conv, [this](int32_t id) { return sole_reader(id); }, taken, !cuda_);
  }

  bool wants_nhwc(const Node& n) const {
    return wants_nhwc(n, cuda_, tf32_, p_.graph) || (cuda_ && trains_nhwc(n));
  }

 public:
  // Whether f32 convolutions with attr tf32 may go NHWC: in programs without weight gradients.
  // In a training step cuDNN's NHWC TF32 backward algorithms (chosen by timing) gave weight
  // gradients up to 12% away from f32 on a small ResNet-shaped net in one run of three (0.2% in
  // the others, 0.04% on NCHW), so f32 training stays NCHW; f16/bf16 training goes NHWC.
  static bool tf32_nhwc(const Program& p) {
    for (const Node& n : p.graph.nodes)
      if (n.op == OpId::ConvGradWeight) return false;
    return true;
  }

  // The convolutions that lead: the pass runs when a program has one.
  static bool wants_nhwc(const Node& n, bool cuda, bool tf32, const detail::GraphImpl& g) {
    if (layout_of(n.op, n.attrs) != Layout::plain) return false;
    if (n.op == OpId::QuantizedConv) return true;
    if (n.outputs.size() != 1 || n.inputs.size() < 2) return false;
    // the CPU: 2-D f32 convolutions of programs without weight gradients (`tf32`: their gradient
    // convolutions stay NCHW), which oneDNN runs on NHWC (its brgemm kernels' layout: NCHW data
    // would be reordered in and out around each one)
    if (!cuda)
      return tf32 && (n.op == OpId::Conv || n.op == OpId::ConvTranspose) &&
             n.outputs[0].dtype == f32 && g.info(n.inputs[0]).shape.size() == 4 &&
             g.info(n.inputs[1]).shape.size() == 4;
    if (n.op != OpId::Conv && n.op != OpId::ConvTranspose && n.op != OpId::ConvGradWeight)
      return false;
    const DType t = n.outputs[0].dtype;
    const bool tensor_cores =
        t == f16 || t == bf16 || (t == f32 && tf32 && n.attrs.b("tf32", false));
    return tensor_cores && cudnn_direct(n, g);
  }

  // A 2-D float conv-family node that cuDNN runs on its own buffers: symmetric pads, and (for the
  // gradients) the size of the conv's output following from its input's as cuDNN computes it.
  static bool cudnn_direct(const Node& n, const detail::GraphImpl& g) {
    const Shape& a = g.info(n.inputs[0]).shape;
    const Shape& b = n.op == OpId::ConvGradWeight ? g.info(n.inputs[1]).shape : n.outputs[0].shape;
    const Shape& w =
        n.op == OpId::ConvGradWeight ? n.attrs.ints("weight_shape") : g.info(n.inputs[1]).shape;
    const auto& pads = n.attrs.ints("pads");
    if (a.size() != 4 || b.size() != 4 || w.size() != 4 || pads.size() != 4 ||
        pads[0] != pads[2] || pads[1] != pads[3])
      return false;
    if (n.op == OpId::Conv) return true;  // its output size is the one cuDNN computes
    if (!is_static(a) || !is_static(b) || !is_static(w)) return false;
    // the conv's input (conv_grad_weight's x, conv_transpose's output) and output
    const Shape& in = n.op == OpId::ConvGradWeight ? a : b;
    const Shape& out = n.op == OpId::ConvGradWeight ? b : a;
    const auto &stride = n.attrs.ints("stride"), &dil = n.attrs.ints("dilation");
    for (int i = 0; i < 2; ++i) {
      const int64_t span = in[2 + i] + 2 * pads[i] - ((w[2 + i] - 1) * dil[i] + 1);
      if (span < 0 || span / stride[i] + 1 != out[2 + i]) return false;
    }
    return true;
  }

 private:
  const TensorInfo& info(ValueRef v) const { return p_.graph.info(v); }

  // Elementwise nodes whose inputs are 0-d or have the output's shape (on the CPU also 4-D
  // inputs that broadcast, as a squeeze-and-excitation scale (N, C, 1, 1): permuted alike, they
  // broadcast alike), and per-tensor quantize / dequantize: they compute the same on any layout.
  bool agnostic(const Node& n) const {
    if (n.outputs.size() != 1 || n.outputs[0].shape.size() != 4) return false;
    const Shape& out = n.outputs[0].shape;
    if (n.op == OpId::Quantize || n.op == OpId::Dequantize)
      return n.inputs.size() == 3 && info(n.inputs[0]).shape == out &&
             info(n.inputs[1]).shape.empty() && info(n.inputs[2]).shape.empty();
    if (fused::arity(n.op) == 0 || n.inputs.size() != static_cast<size_t>(fused::arity(n.op)))
      return false;
    for (auto v : n.inputs) {
      const Shape& in = info(v).shape;
      if (!(in == out || in.empty() || (!cuda_ && in.size() == 4))) return false;
    }
    return true;
  }

  // The training ops between NHWC convolutions, which CUDA runs on NHWC data: batch norm and its
  // gradient over 4-D values, the gradients of 2-D max and adaptive average pooling.
  bool trains_nhwc(const Node& n) const {
    if (layout_of(n.op, n.attrs) != Layout::plain || n.inputs.empty()) return false;
    switch (n.op) {
      case OpId::BatchNormTrain:
        return info(n.inputs[0]).shape.size() == 4;
      case OpId::BatchNormTrainGrad:
        return n.inputs.size() > 1 && info(n.inputs[1]).shape.size() == 4;
      case OpId::MaxPoolGrad:
      case OpId::AdaptiveAvgPoolGrad:
        return info(n.inputs[0]).shape.size() == 4 && n.attrs.ints("input_shape").size() == 4;
      default:
        return false;
    }
  }

  // Whether a converted node takes input k NHWC, and whether input k is a weight that becomes
  // (O, kh, kw, C/G) (weights_khwc): what the op's record declares for layout channels_last.
  static bool nhwc_input(const Node& n, size_t k) {
    const OpDef& def = op_def(n.op);
    KILN_ASSERT(def.nhwc_input);
    return def.nhwc_input(n.attrs, static_cast<int>(k), static_cast<int>(n.inputs.size()));
  }
  static bool khwc_weight(const Node& n, size_t k) {
    return static_cast<int>(k) == op_def(n.op).khwc_weight_input;
  }

  // 2-D max and adaptive average pooling (also of int8 data: dequantize_adaptive_avg_pool), which
  // CUDA runs on NHWC data (max_pool's indices stay in-plane); the pass gives them channels_last
  // where their input is NHWC already.
  // (The CPU's float max and adaptive average pooling too: its NHWC kernels read channels
  // contiguously.)
  bool pools_nhwc(const Node& n) const {
    if (layout_of(n.op, n.attrs) != Layout::plain || n.inputs.empty()) return false;
    if (!cuda_ &&
        (n.op == OpId::DequantizeAdaptiveAvgPool || !is_floating(info(n.inputs[0]).dtype)))
      return false;
    if (n.op != OpId::MaxPool && n.op != OpId::AdaptiveAvgPool &&
        n.op != OpId::DequantizeAdaptiveAvgPool)
      return false;
    const char* size = n.op == OpId::MaxPool ? "kernel" : "output_size";
    return info(n.inputs[0]).shape.size() == 4 && n.attrs.ints(size).size() == 2;
  }

  // The CPU: 4-D float instance norm, which its NHWC kernel runs where its input is NHWC (a style
  // transfer network's norm between convolutions).
  bool norm_nhwc(const Node& n) const {
    return !cuda_ && n.op == OpId::InstanceNorm && layout_of(n.op, n.attrs) == Layout::plain &&
           info(n.inputs[0]).shape.size() == 4 && is_floating(info(n.inputs[0]).dtype);
  }

  // The CPU: a 4-D pad with its pads known (the pad before a convolution that a reflect-padded
  // network writes out): on NHWC data with its pads permuted alike.
  bool pad_nhwc(const Node& n) const {
    return !cuda_ && n.op == OpId::Pad && n.inputs.size() == 1 &&
           info(n.inputs[0]).shape.size() == 4 && n.attrs.has("pads") &&
           n.attrs.ints("pads").size() == 8;
  }
  void pad_on_nhwc(int32_t id) {
    const Node& n = p_.graph.nodes[id];
    const std::vector<int64_t>& pads = n.attrs.ints("pads");  // (begin, end) per dim
    std::vector<int64_t> permuted;
    for (int64_t d : kToNhwc) {
      permuted.push_back(pads[2 * d]);
      permuted.push_back(pads[2 * d + 1]);
    }
    Attrs a = n.attrs;
    a.set("pads", permuted);
    add_like(id, {as_nhwc(n.inputs[0])}, std::move(a), nhwc_);
  }

  // The CPU: a sum, mean, max or min of a value that exists as NHWC reduces it there, over the
  // same dims (a squeeze-and-excitation block's mean over H and W: no transpose of the whole
  // value). Its axes on NHWC, where the result is the same (keepdims: an NHWC result; otherwise
  // the kept dims must come in the same order on both layouts), else nothing.
  std::optional<std::vector<int64_t>> nhwc_axes(const Node& n) const {
    if (cuda_ ||
        (n.op != OpId::Sum && n.op != OpId::Mean && n.op != OpId::Max && n.op != OpId::Min) ||
        n.inputs.size() != 1 || info(n.inputs[0]).shape.size() != 4 || !slot(nhwc_, n.inputs[0]))
      return {};
    constexpr int64_t kAt[4] = {0, 3, 1, 2};  // NCHW dim -> its place in NHWC
    std::vector<int64_t> axes;
    bool reduced[4] = {};
    for (int64_t a : n.attrs.ints("axes")) {
      if (a < -4 || a > 3) return {};
      reduced[a < 0 ? a + 4 : a] = true;
    }
    for (int d = 0; d < 4; ++d)
      if (reduced[d]) axes.push_back(kAt[d]);
    std::sort(axes.begin(), axes.end());
    if (!n.attrs.b("keepdims")) {
      int64_t last = -1;
      for (int d = 0; d < 4; ++d) {
        if (reduced[d]) continue;
        if (kAt[d] < last) return {};
        last = kAt[d];
      }
    }
    return axes;
  }
  void reduce_nhwc(int32_t id, const std::vector<int64_t>& axes) {
    const Node& n = p_.graph.nodes[id];
    Attrs a = n.attrs;
    a.set("axes", axes);
    add_like(id, {as_nhwc(n.inputs[0])}, std::move(a), nhwc_);
  }

  // The CPU: a concat along the channels of 4-D values that all exist as NHWC, or a split along
  // the channels of one: on NHWC along its last dim (ShuffleNet's two branches, joined and parted
  // again in every block, with no transposes between their convolutions).
  bool channels_nhwc(const Node& n) const {
    if (cuda_ || (n.op != OpId::Concat && n.op != OpId::Split) || n.attrs.i("axis") != 1)
      return false;
    for (auto v : n.inputs)
      if (info(v).shape.size() != 4 || !slot(nhwc_, v)) return false;
    return true;
  }
  void channels_on_nhwc(int32_t id) {
    const Node& n = p_.graph.nodes[id];
    std::vector<ValueRef> inputs;
    for (auto v : n.inputs) inputs.push_back(as_nhwc(v));
    Attrs a = n.attrs;
    a.set("axis", int64_t{3});
    add_like(id, std::move(inputs), std::move(a), nhwc_);
  }

  // The CPU: a channel shuffle of a value that exists as NHWC, reshape (N, C, H, W) -> (N, g,
  // C / g, H, W), transpose (0, 2, 1, 3, 4), reshape back to (N, C, H, W), each read only by the
  // next: the last reshape's node when node `id` starts one. On NHWC it is (N, H, W, g, C / g)
  // transposed to (N, H, W, C / g, g): no transposes of the whole value around it.
  std::optional<int32_t> channel_shuffle(int32_t id) const {
    const Node& r1 = p_.graph.nodes[id];
    if (cuda_ || r1.op != OpId::Reshape || r1.inputs.size() != 1 || !slot(nhwc_, r1.inputs[0]))
      return {};
    const Shape& x = info(r1.inputs[0]).shape;
    const Shape& g = r1.outputs[0].shape;
    if (x.size() != 4 || !is_static(x) || g.size() != 5 || g[0] != x[0] || g[1] * g[2] != x[1] ||
        g[3] != x[2] || g[4] != x[3])
      return {};
    const int32_t t = sole_reader(id);
    if (t < 0 || p_.graph.nodes[t].op != OpId::Transpose ||
        p_.graph.nodes[t].attrs.ints("perm") != std::vector<int64_t>{0, 2, 1, 3, 4})
      return {};
    const int32_t r2 = sole_reader(t);
    if (r2 < 0 || p_.graph.nodes[r2].op != OpId::Reshape || p_.graph.nodes[r2].inputs.size() != 1 ||
        p_.graph.nodes[r2].outputs[0].shape != x)
      return {};
    return r2;
  }
  void shuffle_on_nhwc(int32_t id, int32_t end) {
    const Shape& x = info(p_.graph.nodes[id].inputs[0]).shape;
    const int64_t groups = p_.graph.nodes[id].outputs[0].shape[1];
    Attrs a;
    a.set("shape", Shape{x[0], x[2], x[3], groups, x[1] / groups});
    ValueRef v{out_.graph.add(OpId::Reshape, {as_nhwc(p_.graph.nodes[id].inputs[0])}, a), 0};
    Attrs t;
    t.set("perm", std::vector<int64_t>{0, 1, 2, 4, 3});
    v = {out_.graph.add(OpId::Transpose, {v}, t), 0};
    Attrs b;
    b.set("shape", Shape{x[0], x[2], x[3], x[1]});
    slot(nhwc_, {end, 0}) = ValueRef{out_.graph.add(OpId::Reshape, {v}, b), 0};
    shuffled_[p_.graph.nodes[end].inputs[0].node] = 1;
    shuffled_[end] = 1;
  }

  // Whether a pool's outputs are (N, 1, 1, C) (global pooling), which reach NCHW readers through
  // reshapes, not transposes.
  static bool single_position(const Node& n) {
    const Shape& s = n.outputs[0].shape;
    return s.size() == 4 && s[2] == 1 && s[3] == 1;
  }

  // Whether some reader of node `id` would take its output as NHWC (else an agnostic node runs
  // on NCHW, so that the transpose moves its input, often int8, rather than its f32 output).
  bool read_as_nhwc(int32_t id) const {
    int8_t& known = read_as_nhwc_[id];
    if (known >= 0) return known;
    known = 0;
    for (auto [r, k] : readers_[id]) {
      const Node& n = p_.graph.nodes[r];
      if (wants_nhwc(n) && nhwc_input(n, k)) return (known = 1);
      if (agnostic(n) && (read_as_nhwc(r) || others_nhwc(n, k))) return (known = 1);
      if (pools_nhwc(n) && k == 0 && (read_as_nhwc(r) || single_position(n)))
        return (known = 1);
      if ((norm_nhwc(n) || pad_nhwc(n)) && k == 0 && read_as_nhwc(r)) return (known = 1);
    }
    return false;
  }

  // Whether n has 4-D inputs besides its input k and all of them exist as NHWC already (a
  // residual add whose other operand is NHWC: with input k NHWC too, it runs on NHWC).
  bool others_nhwc(const Node& n, size_t k) const {
    int others = 0;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (j == k || info(n.inputs[j]).shape.size() != 4) continue;
      if (!slot(nhwc_, n.inputs[j])) return false;
      ++others;
    }
    return others > 0;
  }

  // Whether every 4-D input of n exists as NHWC: an elementwise node of several such inputs
  // whose reader takes NCHW runs on NHWC, its output transposed once rather than each input.
  bool inputs_nhwc(const Node& n) const {
    int nhwc = 0;
    for (auto v : n.inputs) {
      if (info(v).shape.size() != 4) continue;
      if (!slot(nhwc_, v)) return false;
      ++nhwc;
    }
    return nhwc > 1;
  }

  // Running n on NHWC transposes its inputs (unless they are NHWC already), on NCHW its output:
  // the cheaper, by element size (dequantize's u8 input rather than its f32 output).
  bool cheaper_as_nhwc(const Node& n) const {
    bool all_nhwc = true;
    size_t in_bytes = 0;
    for (auto v : n.inputs) {
      if (info(v).shape.empty()) continue;
      all_nhwc = all_nhwc && slot(nhwc_, v).has_value();
      in_bytes = std::max(in_bytes, size_of(info(v).dtype));
    }
    return all_nhwc || in_bytes <= size_of(n.outputs[0].dtype);
  }

  static std::optional<ValueRef>& slot(std::vector<Slot>& s, ValueRef v) {
    auto& per_node = s[v.node];
    if (per_node.size() <= static_cast<size_t>(v.index)) per_node.resize(v.index + 1);
    return per_node[v.index];
  }
  static const std::optional<ValueRef>& slot(const std::vector<Slot>& s, ValueRef v) {
    static const std::optional<ValueRef> none;
    const auto& per_node = s[v.node];
    return per_node.size() > static_cast<size_t>(v.index) ? per_node[v.index] : none;
  }

  // v with its dims permuted; a reshape (no copy) when only dims of size 1 move, such as
  // (N, 1, 1, C) to (N, C, 1, 1) after global pooling.
  ValueRef transpose(ValueRef v, const std::vector<int64_t>& perm) {
    const Shape& s = out_.graph.info(v).shape;
    Shape to;
    int64_t last = -1;
    bool order_kept = true;
    for (int64_t d : perm) {
      to.push_back(s[d]);
      if (s[d] == 1) continue;
      order_kept = order_kept && d > last;
      last = d;
    }
    Attrs a;
    if (order_kept && is_static(s)) {
      a.set("shape", to);
      return {out_.graph.add(OpId::Reshape, {v}, a), 0};
    }
    a.set("perm", perm);
    return {out_.graph.add(OpId::Transpose, {v}, a), 0};
  }

  // The value (of the source program) in the new program, NCHW or NHWC, made once on demand.
  ValueRef as_nchw(ValueRef v) {
    auto& s = slot(nchw_, v);
    if (!s) s = transpose(emitted(slot(nhwc_, v)), kToNchw);
    return *s;
  }
  ValueRef as_nhwc(ValueRef v) {
    auto& s = slot(nhwc_, v);
    if (!s) s = transpose(emitted(slot(nchw_, v)), kToNhwc);
    return *s;
  }
  static ValueRef emitted(const std::optional<ValueRef>& s) {
    KILN_ASSERT(s.has_value());  // every value is emitted before its first reader
    return *s;
  }

  // (the node's 4-D outputs go to `into`, others, such as batch norm's statistics, stay NCHW)
  // (`op`: the node's own op, or the fused op that replaces it)
  void add_like(int32_t id, std::vector<ValueRef> inputs, Attrs attrs, std::vector<Slot>& into,
                std::optional<OpId> op = {}) {
    const Node& n = p_.graph.nodes[id];
    const int32_t nid =
        out_.graph.add(op.value_or(n.op), std::move(inputs), std::move(attrs), n.name);
    out_.graph.nodes[nid].origin = n.origin;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      slot(n.outputs[k].shape.size() == 4 ? into : nchw_, {id, static_cast<int32_t>(k)}) =
          ValueRef{nid, static_cast<int32_t>(k)};
  }

  void copy(int32_t id) {
    const Node& n = p_.graph.nodes[id];
    Node c = n;
    for (auto& v : c.inputs) v = as_nchw(v);
    const int32_t nid = out_.graph.add_inferred(std::move(c));
    for (size_t k = 0; k < n.outputs.size(); ++k)
      slot(nchw_, {id, static_cast<int32_t>(k)}) = ValueRef{nid, static_cast<int32_t>(k)};
  }

  // A conv's weight (O, C/G, kh, kw) as (O, kh, kw, C/G): a constant permuted now, else a
  // transpose (once per value: a training step's conv and conv_transpose share it).
  ValueRef weights_khwc(ValueRef v) {
    const Node& src = p_.graph.nodes[v.node];
    if (src.op != OpId::Constant || src.value.device().kind != Device::Kind::cpu)
      return as_nhwc(v);
    const Array& a = src.value;
    const Shape& s = a.shape();
    Array r = Array::empty({s[0], s[2], s[3], s[1]}, a.dtype());
    const size_t es = size_of(a.dtype());
    const auto* in = static_cast<const char*>(a.data());
    auto* out = static_cast<char*>(r.data());
    for (int64_t o = 0; o < s[0]; ++o)
      for (int64_t c = 0; c < s[1]; ++c)
        for (int64_t h = 0; h < s[2]; ++h)
          for (int64_t w = 0; w < s[3]; ++w)
            std::memcpy(out + (((o * s[2] + h) * s[3] + w) * s[1] + c) * es,
                        in + (((o * s[1] + c) * s[2] + h) * s[3] + w) * es, es);
    Node c;
    c.op = OpId::Constant;
    c.value = std::move(r);
    c.name = src.name;
    c.outputs = {{c.value.shape(), c.value.dtype()}};
    return {out_.graph.add_inferred(std::move(c)), 0};
  }

  void convert(int32_t id, const Epilogue& e) {
    const Node& n = p_.graph.nodes[id];
    std::vector<ValueRef> in;
    // CUDA's int8 convolutions read (O, kh, kw, C) weights: constant ones are permuted now
    // (weights_ohwi) rather than at every run
    const bool ohwi = n.op == OpId::QuantizedConv && cuda_ && n.attrs.i("groups") == 1 &&
                      info(n.inputs[3]).dtype == i8 &&
                      p_.graph.nodes[n.inputs[3].node].op == OpId::Constant;
    const std::optional<ValueRef> image = quantized_image(id);
    // the CPU: an f32 conv of an image (at most 4 channels) that exists as NCHW only (a graph
    // input) reads it so (nchw_x): oneDNN lays out the few channels faster than a transpose
    const bool nchw_x = !cuda_ && n.op == OpId::Conv && !slot(nhwc_, n.inputs[0]) &&
                        info(n.inputs[0]).shape[1] <= 4;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (k == 0 && image)
        in.push_back(as_nchw(*image));
      else if (k == 0 && nchw_x) in.push_back(as_nchw(n.inputs[0]));
      else if (khwc_weight(n, k) || (ohwi && k == 3))
        in.push_back(weights_khwc(n.inputs[k]));
      else
        in.push_back(nhwc_input(n, k) ? as_nhwc(n.inputs[k]) : as_nchw(n.inputs[k]));
    }
    Attrs a = n.attrs;
    a.set("channels_last", true);
    if (n.op == OpId::QuantizedConv && zero_constant(n.inputs[5])) a.set("zero_w_zp", true);
    if (ohwi) a.set("weights_ohwi", true);
    if (image) a.set("quantize_x", true);
    if (nchw_x) a.set("nchw_x", true);
    std::optional<OpId> fused;
    if (e.last >= 0) {  // the conv with its epilogue: fused_conv
      fused = OpId::FusedConv;
      set_epilogue_attrs(p_, e, a);
      if (e.residual) in.push_back(as_nhwc(*e.residual));
    }
    add_like(id, std::move(in), std::move(a), nhwc_, fused);
    for (int32_t r : e.absorbed) slot(nhwc_, {r, 0}) = *slot(nhwc_, {id, 0});
  }

  // CUDA: the f32 NCHW image that a quantized conv's x quantizes, when the conv can take it
  // instead (quantize_x: its kernel quantizes while it makes the padded copy it reads anyway).
  // The quantize must be per tensor with the conv's own x scale and zero point, read by the conv
  // alone, over at most 4 channels (an image: the first conv of a network) that exist as NCHW.
  std::optional<ValueRef> quantized_image(int32_t conv) const {
    const Node& n = p_.graph.nodes[conv];
    if (!cuda_ || n.op != OpId::QuantizedConv || n.attrs.b("quantize_x", false)) return {};
    const ValueRef x = n.inputs[0];
    const Node& q = p_.graph.nodes[x.node];
    if (q.op != OpId::Quantize || q.inputs.size() != 3 || sole_reader(x.node) != conv ||
        !(q.inputs[1] == n.inputs[1]) || !(q.inputs[2] == n.inputs[2]))
      return {};
    const TensorInfo& f = info(q.inputs[0]);
    if (f.dtype != f32 || f.shape.size() != 4 || f.shape[1] < 1 || f.shape[1] > 4 ||
        !info(q.inputs[1]).shape.empty())
      return {};
    // (an image made NHWC here stays with its quantize, which then runs on NHWC: no f32 transpose)
    if (!slot(nchw_, q.inputs[0])) return {};
    return q.inputs[0];
  }

  // Whether v is a constant of zeros (a weight zero point of symmetric quantization).
  bool zero_constant(ValueRef v) const {
    const Node& src = p_.graph.nodes[v.node];
    if (src.op != OpId::Constant || src.value.device().kind != Device::Kind::cpu) return false;
    const auto* bytes = static_cast<const unsigned char*>(src.value.data());
    return std::all_of(bytes, bytes + src.value.nbytes(), [](unsigned char b) { return b == 0; });
  }

  void keep_nhwc(int32_t id) {
    const Node& n = p_.graph.nodes[id];
    std::vector<ValueRef> in;
    for (auto v : n.inputs) in.push_back(info(v).shape.empty() ? as_nchw(v) : as_nhwc(v));
    add_like(id, std::move(in), n.attrs, nhwc_);
  }

  const Program& p_;
  const bool cuda_;  // the target has NHWC float convolutions, pooling and training kernels
                     // (else the CPU: NHWC f32 inference convolutions and float pooling)
  const bool tf32_;  // f32 convolutions with attr tf32 may go NHWC (tf32_nhwc)
  Program out_;
  // per source value: its NCHW (as in the source) and NHWC versions in the new program
  std::vector<Slot> nchw_, nhwc_;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> readers_;  // (node, input index)
  std::vector<char> is_output_;                                    // node's value is returned
  std::map<int32_t, Epilogue> epilogues_;                          // by conv
  mutable std::vector<int8_t> read_as_nhwc_;                       // -1: not yet known
  std::vector<char> shuffled_;  // inside a channel shuffle emitted at its first reshape
};

}  // namespace

bool channels_last_applies(const Program& p, Backend target) {
  const bool cuda = target == Backend::cuda;
  const bool tf32 = Rewriter::tf32_nhwc(p);
  for (const Node& n : p.graph.nodes)
    if (Rewriter::wants_nhwc(n, cuda, tf32, p.graph)) return true;
  return false;
}

Program channels_last(const Program& p, Backend target) {
  if (!channels_last_applies(p, target)) return p;
  return Rewriter(p, target).run();
}

}  // namespace kiln
