// Cases of matrix products, convolutions, pooling, normalization and losses.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend_ops/harness.h"
#include "core/graph_impl.h"

namespace kiln::harness {
namespace {

constexpr Layout kDense = Layout::dense, kT = Layout::transposed;

// Small integers keep integer products exact and far from overflow in wide types.
Tensor operand(Case& c, const Shape& s, DType t, Layout l = kDense) {
  if (is_floating(t)) return c.rand(s, t, -1, 1, l);
  return c.rand(s, t, is_signed(t) ? -3 : 0, 3, l);
}

// ---- linalg ----

const bool kMatmul =
    register_cases({OpId::Matmul, 12, [](Case& c, DType t, int i) {
                      struct S {
                        Shape a, b;
                        Layout la, lb;
                      };
                      const S s[] = {{{31, 33}, {33, 17}, kDense, kDense},
                                     {{16, 128}, {128, 32}, kDense, kDense},
                                     {{7, 257}, {257, 9}, kDense, kDense},
                                     {{3, 17, 33}, {33, 5}, kDense, kDense},
                                     {{2, 1, 8, 31}, {4, 31, 6}, kDense, kDense},
                                     {{33}, {33, 4}, kDense, kDense},
                                     {{5, 129}, {129}, kDense, kDense},
                                     {{33, 65}, {65, 31}, kT, kT},
                                     {{4, 0}, {0, 5}, kDense, kDense},
                                     {{0, 7}, {7, 3}, kDense, kDense},
                                     {{4, 4099}, {4099, 3}, kDense, kDense},
                                     {{130, 257}, {257, 129}, kDense, kDense}};
                      Tensor a = operand(c, s[i].a, t, s[i].la), b = operand(c, s[i].b, t, s[i].lb);
                      c.outs = {matmul(a, b)};
                      c.tol_scale = 2;
                      c.note(fmt::format("{} @ {}{}", to_string(s[i].a), to_string(s[i].b),
                                         s[i].la == kT ? " transposed" : ""));
                      return true;
                    }});

const bool kLinear = register_cases(
    {OpId::Linear, 7, [](Case& c, DType t, int i) {
       struct S {
         Shape x;
         int64_t out;
         bool bias;
         Layout l;
       };
       const S s[] = {{{8, 31}, 17, true, kDense},    {{4, 128}, 33, false, kDense},
                      {{2, 3, 257}, 9, true, kDense}, {{65, 33}, 5, true, kT},
                      {{0, 16}, 4, true, kDense},     {{3, 1}, 129, false, kDense},
                      {{2, 3, 0}, 5, true, kDense}};  // K = 0: the output is the bias
       const int64_t in = s[i].x.back();
       Tensor x = operand(c, s[i].x, t, s[i].l);
       Tensor w = operand(c, {s[i].out, in}, t);
       std::optional<Tensor> b;
       if (s[i].bias) b = operand(c, {s[i].out}, t);
       c.outs = {linear(x, w, b)};
       c.tol_scale = 2;
       c.note(fmt::format("x {} out {}{}", to_string(s[i].x), s[i].out, s[i].bias ? " bias" : ""));
       return true;
     }});

// fused_matmul (which the CPU's fuse_cpu_matmul_epilogues builds; CPU only: kCpuOnly): x times
// (K, N) or, transposed, (N, K), then its epilogue (add a row, add the output's shape, activations)
const bool kFusedMatmul = register_cases(
    {OpId::FusedMatmul, 4, [](Case& c, DType t, int i) {
       struct S {
         Shape x;
         int64_t n;
         bool transpose_b;
         std::vector<int64_t> steps;  // MatmulStep values
       };
       const S s[] = {{{8, 31}, 17, false, {1, 4}},            // bias, gelu
                      {{2, 3, 130}, 65, true, {1, 1, 3}},      // bias, residual, relu
                      {{40, 96}, 72, false, {2, 7, 5}},        // gate, silu, gelu tanh
                      {{2, 100, 256}, 40, false, {1, 6, 8}}};  // bias, sigmoid, tanh
       const S& k = s[i];
       Shape out = k.x;
       out.back() = k.n;
       std::vector<Tensor> in{
           operand(c, k.x, t),
           operand(c, k.transpose_b ? Shape{k.n, k.x.back()} : Shape{k.x.back(), k.n}, t)};
       for (int64_t st : k.steps)
         if (st == 1 || st == 2) in.push_back(operand(c, in.size() == 2 ? Shape{k.n} : out, t));
       Attrs a{{"transpose_b", k.transpose_b}};
       a.set("epilogue", k.steps);
       c.outs = {detail::make_node1(OpId::FusedMatmul, in, a)};
       c.tol_scale = 2;
       c.note(fmt::format("x {} n {} steps {}", to_string(k.x), k.n, fmt::join(k.steps, ",")));
       return true;
     }});

// ---- convolutions ----

struct ConvCase {
  Shape x, w;
  ConvOptions o;
  bool bias;
  Layout l;
};
const ConvCase kConvs[] = {
    {{2, 3, 9, 9}, {4, 3, 3, 3}, {}, true, kDense},
    {{2, 3, 10, 9}, {4, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, false, kDense},
    {{1, 4, 8, 8}, {6, 2, 3, 3}, {.groups = 2}, true, kDense},
    {{1, 4, 11, 12}, {4, 1, 3, 3}, {.padding = {1, 2, 0, 1}, .groups = 4}, true, kDense},
    {{2, 3, 9, 9}, {5, 3, 3, 3}, {.dilation = {2, 2}}, true, kDense},
    {{1, 2, 9, 8},
     {3, 2, 4, 3},
     {.stride = {2, 1}, .pad_mode = PadMode::same_upper},
     false,
     kDense},
    {{1, 2, 9, 8}, {3, 2, 4, 3}, {.stride = {2, 2}, .pad_mode = PadMode::same_lower}, true, kDense},
    {{2, 3, 33}, {5, 3, 4}, {.stride = {2}, .padding = {1}}, true, kDense},
    {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 2}, {.padding = {1, 0, 1}}, true, kDense},
    {{2, 3, 7, 9}, {4, 3, 3, 2}, {}, true, kT},
    {{1, 33, 5, 5}, {31, 33, 1, 1}, {}, true, kDense},
    {{0, 3, 6, 6}, {4, 3, 3, 3}, {}, true, kDense},
};

Tensor conv_nd(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b,
               const ConvOptions& o) {
  const int nd = x.rank() - 2;
  return nd == 1 ? conv1d(x, w, b, o) : nd == 2 ? conv2d(x, w, b, o) : conv3d(x, w, b, o);
}

std::string conv_label(const ConvCase& k) {
  return fmt::format("x {} w {} stride [{}] pad [{}] dil [{}] groups {}{}", to_string(k.x),
                     to_string(k.w), fmt::join(k.o.stride, ","), fmt::join(k.o.padding, ","),
                     fmt::join(k.o.dilation, ","), k.o.groups, k.l == kT ? " transposed" : "");
}

const bool kConv =
    register_cases({OpId::Conv, static_cast<int>(std::size(kConvs)), [](Case& c, DType t, int i) {
                      const ConvCase& k = kConvs[i];
                      Tensor x = c.rand(k.x, t, k.l), w = c.rand(k.w, t);
                      std::optional<Tensor> b;
                      if (k.bias) b = c.rand({k.w[0]}, t);
                      c.outs = {conv_nd(x, w, b, k.o)};
                      c.tol_scale = 2;
                      c.note(conv_label(k));
                      return true;
                    }});

// fused_conv (which the channels_last pass builds; here in the plain layout): each conv case with
// a residual, a relu, or both.
const bool kFusedConv = register_cases(
    {OpId::FusedConv, static_cast<int>(std::size(kConvs)), [](Case& c, DType t, int i) {
       const ConvCase& k = kConvs[i];
       Tensor x = c.rand(k.x, t, k.l), w = c.rand(k.w, t);
       std::optional<Tensor> b;
       if (k.bias) b = c.rand({k.w[0]}, t);
       const Tensor conv = conv_nd(x, w, b, k.o);
       const bool residual = i % 3 != 1, relu = i % 3 != 0;
       Attrs a = conv.graph_impl()->nodes[conv.node_id()].attrs;
       a.set("has_residual", residual);
       a.set("relu", relu);
       std::vector<Tensor> in{x, w};
       if (b) in.push_back(*b);
       if (residual) in.push_back(c.rand(conv.shape(), t));
       c.outs = {detail::make_node1(OpId::FusedConv, in, a)};
       c.tol_scale = 2;
       c.note(conv_label(k) + (residual ? " +residual" : "") + (relu ? " relu" : ""));
       return true;
     }});

const bool kConvGradWeight = register_cases(
    {OpId::ConvGradWeight, static_cast<int>(std::size(kConvs)), [](Case& c, DType t, int i) {
       const ConvCase& k = kConvs[i];
       const Shape dy_shape = shape_of([&](Graph& g) {
         return conv_nd(g.placeholder(k.x, t), g.placeholder(k.w, t), std::nullopt, k.o);
       });
       Tensor x = c.rand(k.x, t, k.l), dy = c.rand(dy_shape, t);
       c.outs = {conv_grad_weight(x, dy, k.w, k.o)};
       c.tol_scale = 2;
       c.note(conv_label(k));
       return true;
     }});

struct ConvTCase {
  Shape x, w;
  ConvTransposeOptions o;
  bool bias;
};
const ConvTCase kConvTs[] = {
    {{2, 3, 5, 5}, {3, 4, 3, 3}, {}, true},
    {{1, 4, 6, 5},
     {4, 3, 3, 3},
     {.stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 1}},
     false},
    {{1, 4, 5, 5}, {4, 2, 3, 3}, {.stride = {2, 1}, .groups = 2}, true},
    {{2, 2, 6, 6}, {2, 3, 2, 3}, {.dilation = {2, 1}}, true},
    {{2, 3, 31}, {3, 5, 4}, {.stride = {2}, .padding = {1}}, true},
    {{1, 2, 3, 4, 3}, {2, 3, 2, 2, 3}, {.stride = {2, 1, 2}}, true},
    {{0, 3, 4, 4}, {3, 2, 3, 3}, {}, true},
};

const bool kConvTranspose = register_cases(
    {OpId::ConvTranspose, static_cast<int>(std::size(kConvTs)), [](Case& c, DType t, int i) {
       const ConvTCase& k = kConvTs[i];
       Tensor x = c.rand(k.x, t), w = c.rand(k.w, t);
       std::optional<Tensor> b;
       if (k.bias) b = c.rand({k.w[1] * k.o.groups}, t);
       const int nd = static_cast<int>(k.x.size()) - 2;
       c.outs = {nd == 1   ? conv_transpose1d(x, w, b, k.o)
                 : nd == 2 ? conv_transpose2d(x, w, b, k.o)
                           : conv_transpose3d(x, w, b, k.o)};
       c.tol_scale = 2;
       c.note(fmt::format("x {} w {} stride [{}] pad [{}] out_pad [{}] dil [{}] groups {}",
                          to_string(k.x), to_string(k.w), fmt::join(k.o.stride, ","),
                          fmt::join(k.o.padding, ","), fmt::join(k.o.output_padding, ","),
                          fmt::join(k.o.dilation, ","), k.o.groups));
       return true;
     }});

// ---- pooling ----

struct PoolCase {
  Shape x;
  PoolOptions o;
  Layout l;
};
const PoolCase kPools[] = {
    {{2, 3, 8, 8}, {.kernel = {2, 2}}, kDense},
    {{2, 3, 9, 10}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, kDense},
    {{1, 2, 9, 9}, {.kernel = {3, 2}, .stride = {2, 2}, .ceil_mode = true}, kDense},
    {{1, 2, 11, 11},
     {.kernel = {3, 3}, .stride = {1, 2}, .padding = {1, 1}, .count_include_pad = true},
     kDense},
    {{2, 3, 33}, {.kernel = {4}, .stride = {3}, .padding = {2}}, kDense},
    {{1, 2, 5, 6, 7}, {.kernel = {2, 3, 2}, .stride = {2, 2, 2}, .padding = {1, 1, 0}}, kDense},
    {{2, 3, 7, 9}, {.kernel = {2, 3}, .stride = {2, 2}}, kT},
    {{1, 1, 32, 33}, {.kernel = {5, 5}, .stride = {4, 4}, .padding = {2, 2, 1, 1}}, kDense},
    {{0, 2, 6, 6}, {.kernel = {2, 2}}, kDense},
    // 64 taps: CUDA's forward pools give each output a warp
    {{1, 2, 19, 21}, {.kernel = {8, 8}, .stride = {3, 4}, .padding = {2, 3}}, kDense},
};
constexpr int kNumPools = static_cast<int>(std::size(kPools));

std::string pool_label(const PoolCase& k, bool max) {
  return fmt::format(
      "x {} kernel [{}] stride [{}] pad [{}]{}{}{}{}", to_string(k.x), fmt::join(k.o.kernel, ","),
      fmt::join(k.o.stride, ","), fmt::join(k.o.padding, ","),
      max && !k.o.dilation.empty() ? fmt::format(" dil [{}]", fmt::join(k.o.dilation, ",")) : "",
      k.o.ceil_mode ? " ceil" : "", !max && k.o.count_include_pad ? " count_pad" : "",
      k.l == kT ? " transposed" : "");
}

const bool kMaxPool = register_cases(
    {OpId::MaxPool, kNumPools + 2, [](Case& c, DType t, int i) {
       if (i == kNumPools + 1) {  // NaN wins its windows (values only: which NaN is not specified)
         if (!is_floating(t)) return false;
         c.outs = {
             max_pool(c.input({2, 3, 9, 10}, t, with_nans(t, uniform(t, -1, 1))), kPools[1].o)};
         c.grad = false;
         c.note("NaNs; " + pool_label(kPools[1], true));
         return true;
       }
       PoolCase k = i < kNumPools
                        ? kPools[i]
                        : PoolCase{{1, 2, 12, 12}, {.kernel = {3, 3}, .dilation = {2, 2}}, kDense};
       Tensor x = c.distinct(k.x, t, k.l);
       auto [y, idx] = max_pool_with_indices(x, k.o);
       // indices only where windows hold no ties: floats, and bf16 only while a plane fits its
       // 513 exact integers (see Case::distinct)
       const int64_t plane = k.x.size() == 4 ? k.x[2] * k.x[3] : numel(k.x);
       const bool no_ties = is_floating(t) && (t != bf16 || numel(k.x) <= 513 || plane <= 513);
       c.outs = no_ties ? std::vector<Tensor>{y, idx} : std::vector<Tensor>{y};
       c.note(pool_label(k, true));
       return true;
     }});

const bool kAvgPool = register_cases({OpId::AvgPool, kNumPools, [](Case& c, DType t, int i) {
                                        const PoolCase& k = kPools[i];
                                        c.outs = {avg_pool(c.rand(k.x, t, k.l), k.o)};
                                        c.note(pool_label(k, false));
                                        return true;
                                      }});

struct AdaptiveCase {
  Shape x;
  std::vector<int64_t> out;
};
const AdaptiveCase kAdaptive[] = {{{2, 3, 9, 9}, {4, 5}},
                                  {{2, 3, 33}, {7}},
                                  {{1, 2, 5, 6, 7}, {2, 3, 4}},
                                  {{1, 2, 8, 8}, {1, 1}},
                                  {{1, 2, 4, 4}, {8, 6}}};

const bool kAdaptiveAvgPool =
    register_cases({OpId::AdaptiveAvgPool, 5, [](Case& c, DType t, int i) {
                      const AdaptiveCase& k = kAdaptive[i];
                      c.outs = {adaptive_avg_pool(c.rand(k.x, t, i == 0 ? kT : kDense), k.out)};
                      c.note(fmt::format("x {} out [{}]", to_string(k.x), fmt::join(k.out, ",")));
                      return true;
                    }});

const bool kAdaptiveAvgPoolGrad =
    register_cases({OpId::AdaptiveAvgPoolGrad, 5, [](Case& c, DType t, int i) {
                      const AdaptiveCase& k = kAdaptive[i];
                      Shape gs{k.x[0], k.x[1]};
                      gs.insert(gs.end(), k.out.begin(), k.out.end());
                      c.outs = {adaptive_avg_pool_grad(c.rand(gs, t), k.x)};
                      c.note(fmt::format("x {} out [{}]", to_string(k.x), fmt::join(k.out, ",")));
                      return true;
                    }});

const bool kAvgPoolGrad =
    register_cases({OpId::AvgPoolGrad, kNumPools, [](Case& c, DType t, int i) {
                      const PoolCase& k = kPools[i];
                      const Shape gs =
                          shape_of([&](Graph& g) { return avg_pool(g.placeholder(k.x, t), k.o); });
                      c.outs = {avg_pool_grad(c.rand(gs, t), k.x, k.o)};
                      c.note(pool_label(k, false));
                      return true;
                    }});

const bool kMaxPoolGrad =
    register_cases({OpId::MaxPoolGrad, kNumPools, [](Case& c, DType t, int i) {
                      const PoolCase& k = kPools[i];
                      const Shape gs =
                          shape_of([&](Graph& g) { return max_pool(g.placeholder(k.x, t), k.o); });
                      int64_t plane = 1;
                      for (size_t d = 2; d < k.x.size(); ++d) plane *= k.x[d];
                      // indices anywhere in the plane, repeats included (they accumulate)
                      Tensor idx = c.ints(gs, 0, plane - 1, i % 2 ? i32 : i64);
                      c.outs = {max_pool_grad(c.rand(gs, t), idx, k.x)};
                      c.note(pool_label(k, true) + (i % 2 ? " i32 indices" : " i64 indices"));
                      return true;
                    }});

// ---- normalization ----

const bool kSoftmax = [] {
  for (OpId op : {OpId::Softmax, OpId::LogSoftmax}) {
    register_cases(
        {op, 9, [op](Case& c, DType t, int i) {
           struct S {
             Shape x;
             int64_t axis;
             Layout l;
           };
           const S s[] = {{{4, 31}, -1, kDense}, {{3, 128}, -1, kDense},  {{2, 257}, 1, kDense},
                          {{33, 65}, 0, kDense}, {{5, 129}, -1, kT},      {{2, 3, 33}, 1, kDense},
                          {{0, 7}, -1, kDense},  {{2, 4097}, -1, kDense}, {{2, 2048}, -1, kDense}};
           Tensor x = c.rand(s[i].x, t, -4, 4, s[i].l);
           c.outs = {op == OpId::Softmax ? softmax(x, s[i].axis) : log_softmax(x, s[i].axis)};
           c.note(fmt::format("x {} axis {}{}", to_string(s[i].x), s[i].axis,
                              s[i].l == kT ? " transposed" : ""));
           return true;
         }});
  }
  return true;
}();

struct NormShape {
  Shape x;
  int64_t begin;
  bool weight, bias;
  Layout l;
};
const NormShape kNormShapes[] = {
    {{4, 31}, -1, true, true, kDense},
    {{3, 128}, -1, false, false, kDense},
    {{2, 257}, -1, true, false, kDense},
    {{2, 3, 33}, -2, true, true, kDense},
    {{5, 129}, -1, true, true, kT},
    {{0, 16}, -1, true, true, kDense},
    {{2, 4097}, -1, true, true, kDense},
    {{2, 2048}, -1, true, true, kDense},  // long rows: a block each, vector loads
    // few long rows: CUDA splits each row into chunks (vector loads, and odd lengths without)
    {{2, 65600}, -1, true, true, kDense},
    {{1, 65537}, -1, false, false, kDense}};
constexpr int kNumNormShapes = static_cast<int>(std::size(kNormShapes));

const bool kLayerNorm =
    register_cases({OpId::LayerNorm, kNumNormShapes, [](Case& c, DType t, int i) {
                      const NormShape& s = kNormShapes[i];
                      Tensor x = c.rand(s.x, t, -2, 3, s.l);
                      const Shape ws(s.x.end() + s.begin, s.x.end());
                      std::optional<Tensor> w, b;
                      if (s.weight) w = c.rand(ws, t);
                      if (s.bias) b = c.rand(ws, t);
                      c.outs = {layer_norm(x, w, b, s.begin)};
                      c.tol_scale = 2;
                      c.note(fmt::format("x {} begin {}{}{}", to_string(s.x), s.begin,
                                         s.weight ? " weight" : "", s.bias ? " bias" : ""));
                      return true;
                    }});

const bool kRmsNorm = register_cases(
    {OpId::RmsNorm, kNumNormShapes, [](Case& c, DType t, int i) {
       const NormShape& s = kNormShapes[i];
       Tensor x = c.rand(s.x, t, -2, 3, s.l);
       const Shape ws(s.x.end() + s.begin, s.x.end());
       std::optional<Tensor> w;
       if (s.weight) w = c.rand(ws, t);
       c.outs = {rms_norm(x, w, s.begin)};
       c.tol_scale = 2;
       c.note(fmt::format("x {} begin {}{}", to_string(s.x), s.begin, s.weight ? " weight" : ""));
       return true;
     }});

struct ChannelCase {
  Shape x;
  bool affine;
  Layout l;
};
const ChannelCase kChannel[] = {{{2, 3, 5, 7}, true, kDense}, {{4, 33}, false, kDense},
                                {{2, 4, 31}, true, kDense},   {{1, 6, 8, 9}, true, kT},
                                {{3, 2, 129}, false, kDense}, {{0, 4, 3}, true, kDense},
                                {{3, 2, 1}, true, kDense}};  // one element per channel

const bool kBatchNorm =
    register_cases({OpId::BatchNorm, 7, [](Case& c, DType t, int i) {
                      const ChannelCase& k = kChannel[i];
                      const int64_t ch = k.x[1];
                      Tensor x = c.rand(k.x, t, -2, 2, k.l);
                      Tensor mean = c.rand({ch}, t), var = c.rand({ch}, t, 0.5, 2);
                      std::optional<Tensor> w, b;
                      if (k.affine) w = c.rand({ch}, t), b = c.rand({ch}, t);
                      c.outs = {batch_norm(x, mean, var, w, b)};
                      c.note(fmt::format("x {}{}", to_string(k.x), k.affine ? " affine" : ""));
                      return true;
                    }});

// Training batch norm: spatial 1, one channel, 31/32/33 values and channels, a ResNet-sized map.
struct TrainCase {
  Shape x;
  bool weight, bias;
  Layout l;
};
const TrainCase kTrain[] = {
    {{8, 3}, true, true, kDense},          {{16, 1, 5}, true, false, kDense},
    {{4, 33, 1, 1}, false, true, kDense},  {{2, 32, 31}, true, true, kDense},
    {{3, 31, 4, 8}, false, false, kT},     {{33, 5, 2, 2, 2}, true, true, kDense},
    {{8, 64, 56, 56}, true, true, kDense}, {{64, 3, 33}, true, false, kDense}};
constexpr int kNumTrain = sizeof(kTrain) / sizeof(kTrain[0]);

const bool kBatchNormTrain =
    register_cases({OpId::BatchNormTrain, kNumTrain, [](Case& c, DType t, int i) {
                      const TrainCase& k = kTrain[i];
                      const int64_t ch = k.x[1];
                      Tensor x = c.rand(k.x, t, -2, 3, k.l);
                      std::optional<Tensor> w, b;
                      if (k.weight) w = c.rand({ch}, t, 0.5, 1.5);
                      if (k.bias) b = c.rand({ch}, t);
                      auto r = batch_norm_train(x, w, b);
                      c.outs = {r.y, r.mean, r.var};
                      c.tol_scale = 2;
                      c.note(fmt::format("x {}{}{}", to_string(k.x), k.weight ? " weight" : "",
                                         k.bias ? " bias" : ""));
                      return true;
                    }});

const bool kBatchNormTrainGrad =
    register_cases({OpId::BatchNormTrainGrad, kNumTrain, [](Case& c, DType t, int i) {
                      const TrainCase& k = kTrain[i];
                      const int64_t ch = k.x[1];
                      // dweight and dbias are sums over every position but the channel: with dy
                      // of either sign they can cancel to near zero (one case of a GPU run summed
                      // 80 values to -4.4e-5), where a tolerance relative to the result means
                      // nothing. Positive dy and x above the mean keep every summed term positive.
                      Tensor dy = c.rand(k.x, t, 0.1, 1, k.l), x = c.rand(k.x, t, 1.2, 3);
                      Tensor mean = c.rand({ch}, t, 0, 1), var = c.rand({ch}, t, 0.5, 2);
                      std::optional<Tensor> w;
                      if (k.weight) w = c.rand({ch}, t, 0.5, 1.5);
                      auto r = batch_norm_train_grad(dy, x, mean, var, w);
                      c.outs = {r.dx, r.dweight, r.dbias};
                      c.tol_scale = 4;
                      c.note(fmt::format("x {}{}", to_string(k.x), k.weight ? " weight" : ""));
                      return true;
                    }});

const bool kInstanceNorm =
    register_cases({OpId::InstanceNorm, 7, [](Case& c, DType t, int i) {
                      const ChannelCase& k = kChannel[i];
                      if (k.x.size() < 3) return false;
                      const int64_t ch = k.x[1];
                      Tensor x = c.rand(k.x, t, -2, 2, k.l);
                      std::optional<Tensor> w, b;
                      if (k.affine) w = c.rand({ch}, t), b = c.rand({ch}, t);
                      c.outs = {instance_norm(x, w, b)};
                      c.tol_scale = 2;
                      c.note(fmt::format("x {}{}", to_string(k.x), k.affine ? " affine" : ""));
                      return true;
                    }});

const bool kGroupNorm =
    register_cases({OpId::GroupNorm, 6, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x;
                        int64_t groups;
                        bool affine;
                        Layout l;
                      };
                      const S s[] = {{{2, 4, 5, 7}, 2, true, kDense},
                                     {{2, 6, 33}, 3, false, kDense},
                                     {{1, 8, 4, 9}, 8, true, kT},
                                     {{2, 4, 129}, 1, true, kDense},
                                     {{0, 4, 3}, 2, true, kDense},
                                     {{3, 4, 1}, 2, true, kDense}};
                      const int64_t ch = s[i].x[1];
                      Tensor x = c.rand(s[i].x, t, -2, 2, s[i].l);
                      std::optional<Tensor> w, b;
                      if (s[i].affine) w = c.rand({ch}, t), b = c.rand({ch}, t);
                      c.outs = {group_norm(x, s[i].groups, w, b)};
                      c.tol_scale = 2;
                      c.note(fmt::format("x {} groups {}{}", to_string(s[i].x), s[i].groups,
                                         s[i].affine ? " affine" : ""));
                      return true;
                    }});

const bool kDropout = register_cases(
    {OpId::Dropout, 4, [](Case& c, DType t, int i) {
       const Shape shapes[] = {{257}, {33, 65}, {4, 128}, {0, 3}};
       const double p = i % 2 ? 0.5 : 0.1;
       c.outs = {dropout(c.rand(shapes[i], t, i == 1 ? kT : kDense), p, true, 1234 + i)};
       c.note(fmt::format("x {} p {} seed {}", to_string(shapes[i]), p, 1234 + i));
       return true;
     }});

// ---- losses ----

const bool kSoftmaxCrossEntropy = register_cases(
    {OpId::SoftmaxCrossEntropy, 8, [](Case& c, DType t, int i) {
       const Reduction red[] = {Reduction::mean, Reduction::none, Reduction::sum};
       struct S {
         Shape logits;
         int64_t axis;
         bool probs;
         Layout l;
       };
       const S s[] = {{{8, 31}, -1, false, kDense},   {{4, 257}, -1, false, kDense},
                      {{2, 5, 33}, 1, false, kDense}, {{3, 129}, -1, true, kDense},
                      {{33, 17}, -1, false, kT},      {{2, 4, 3}, 1, true, kDense},
                      {{6, 128}, -1, false, kDense},  {{3, 6, 5}, 1, false, kDense}};
       Tensor logits = c.rand(s[i].logits, t, -3, 3, s[i].l);
       Shape ls = s[i].logits;
       const int64_t axis = s[i].axis < 0 ? s[i].axis + static_cast<int64_t>(ls.size()) : s[i].axis;
       Tensor labels;
       if (s[i].probs) {
         labels = softmax(c.rand(ls, t, -2, 2), axis);
       } else {
         const int64_t classes = ls[axis];
         ls.erase(ls.begin() + axis);
         labels = c.ints(ls, 0, classes - 1, i % 2 ? i32 : i64);
       }
       c.outs = {softmax_cross_entropy(logits, labels, red[i % 3], s[i].axis)};
       c.note(fmt::format("logits {} axis {} {} reduction {}", to_string(s[i].logits), s[i].axis,
                          s[i].probs ? "probabilities" : "indices", i % 3));
       return true;
     }});

const bool kNll = register_cases(
    {OpId::Nll, 6, [](Case& c, DType t, int i) {
       const Reduction red[] = {Reduction::mean, Reduction::none, Reduction::sum};
       const Shape shapes[] = {{8, 31}, {4, 257}, {2, 5, 33}, {3, 7, 2, 2}, {16, 128}, {5, 3}};
       const Shape& s = shapes[i];
       Tensor lp = log_softmax(c.rand(s, t, -3, 3), 1);
       Shape ts = s;
       ts.erase(ts.begin() + 1);
       // some targets equal ignore_index (-100 becomes the draw -1 mapped below)
       Tensor target = c.input(ts, i % 2 ? i32 : i64, [&](const Shape& sh) {
         std::vector<double> v = test::to_f64(test::random_ints(sh, -1, s[1] - 1, i64));
         for (auto& x : v)
           if (x < 0) x = -100;
         return from_f64(v, sh, i % 2 ? i32 : i64);
       });
       c.outs = {nll(lp, target, red[i % 3])};
       c.note(fmt::format("log_probs {} reduction {} (some targets ignored)", to_string(s), i % 3));
       return true;
     }});

const bool kMse = register_cases(
    {OpId::Mse, 8, [](Case& c, DType t, int i) {
       const Reduction red[] = {Reduction::mean, Reduction::none, Reduction::sum};
       struct S {
         Shape a, b;
         Layout l;
       };
       const S s[] = {{{257}, {257}, kDense},      {{4, 128}, {128}, kDense},
                      {{33, 65}, {33, 65}, kT},    {{3, 1, 31}, {5, 31}, kDense},
                      {{0, 3}, {3}, kDense},       {{129}, {129}, kDense},
                      {{2, 3, 4}, {3, 1}, kDense}, {{5, 33}, {5, 33}, kDense}};
       c.outs = {mse(c.rand(s[i].a, t, s[i].l), c.rand(s[i].b, t), red[i % 3])};
       c.tol_scale = 2;
       c.note(fmt::format("{} {} reduction {}", to_string(s[i].a), to_string(s[i].b), i % 3));
       return true;
     }});

}  // namespace
}  // namespace kiln::harness
