// Gradients of the linalg and conv families against finite differences (f64, small shapes).
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

void check_matmul(const Shape& a, const Shape& b) {
  SCOPED_TRACE(::testing::Message() << "matmul " << to_string(a) << " @ " << to_string(b));
  check_gradients([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
                  {random_array(a, f64), random_array(b, f64)});
}

TEST(MatmulGrad, Matrices) { check_matmul({3, 4}, {4, 5}); }

TEST(MatmulGrad, VectorOperands) {
  check_matmul({4}, {4, 5});
  check_matmul({3, 4}, {4});
  check_matmul({4}, {4});
  check_matmul({4}, {2, 4, 3});
  check_matmul({2, 3, 4}, {4});
}

TEST(MatmulGrad, BatchedAndBroadcast) {
  check_matmul({2, 3, 4}, {2, 4, 5});
  check_matmul({2, 1, 3, 4}, {3, 4, 2});
  check_matmul({3, 4}, {2, 4, 5});
  check_matmul({2, 3, 4}, {1, 4, 2});
}

TEST(LinearGrad, WithAndWithoutBias) {
  auto no_bias = [](const std::vector<Tensor>& x) { return linear(x[0], x[1]); };
  auto with_bias = [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); };
  check_gradients(no_bias, {random_array({3, 4}, f64), random_array({5, 4}, f64)});
  check_gradients(with_bias,
                  {random_array({3, 4}, f64), random_array({5, 4}, f64), random_array({5}, f64)});
}

TEST(LinearGrad, AnyRankOfX) {
  auto with_bias = [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); };
  check_gradients(
      with_bias, {random_array({2, 3, 4}, f64), random_array({5, 4}, f64), random_array({5}, f64)});
  check_gradients(with_bias,
                  {random_array({4}, f64), random_array({3, 4}, f64), random_array({3}, f64)});
}

Tensor conv_any(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b,
                const ConvOptions& o) {
  switch (x.shape().size()) {
    case 3:
      return conv1d(x, w, b, o);
    case 4:
      return conv2d(x, w, b, o);
    default:
      return conv3d(x, w, b, o);
  }
}

Tensor conv_transpose_any(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b,
                          const ConvTransposeOptions& o) {
  switch (x.shape().size()) {
    case 3:
      return conv_transpose1d(x, w, b, o);
    case 4:
      return conv_transpose2d(x, w, b, o);
    default:
      return conv_transpose3d(x, w, b, o);
  }
}

// Checks d/dx, d/dw and (with a bias) d/dbias; the bias has w[0] (conv) or w[1] * groups
// (conv_transpose) entries.
template <typename Options, typename Build>
void check_conv_like(Build build, const Shape& xs, const Shape& ws, int64_t out_channels,
                     const Options& o, bool bias) {
  SCOPED_TRACE(::testing::Message()
               << "x " << to_string(xs) << " w " << to_string(ws) << (bias ? " bias" : ""));
  std::vector<Array> in{random_array(xs, f64), random_array(ws, f64)};
  if (bias) in.push_back(random_array({out_channels}, f64));
  check_gradients(
      [&](const std::vector<Tensor>& x) {
        return build(x[0], x[1], bias ? std::optional<Tensor>(x[2]) : std::nullopt, o);
      },
      in);
}

void check_conv(const Shape& xs, const Shape& ws, const ConvOptions& o, bool bias = true) {
  check_conv_like(conv_any, xs, ws, ws[0], o, bias);
}

void check_conv_transpose(const Shape& xs, const Shape& ws, const ConvTransposeOptions& o,
                          bool bias = true) {
  check_conv_like(conv_transpose_any, xs, ws, ws[1] * o.groups, o, bias);
}

TEST(ConvGrad, Conv1dStrideAsymmetricPaddingGroups) {
  // (7 + 1 + 2 - 3) / 2 leaves a remainder: x's last column gets no gradient from the stride
  check_conv({2, 4, 7}, {6, 2, 3}, {{2}, {1, 2}, {}, PadMode::explicit_, 2});
  check_conv({1, 2, 5}, {3, 2, 2}, {}, false);
}

TEST(ConvGrad, Conv2dStrideDilationPadding) {
  check_conv({1, 2, 6, 5}, {3, 2, 3, 2}, {{2, 1}, {1, 0, 0, 1}, {1, 2}});
  check_conv({1, 2, 5, 4}, {2, 2, 2, 2}, {{1, 1}, {}, {}, PadMode::same_upper}, false);
}

TEST(ConvGrad, Conv3d) { check_conv({1, 2, 4, 3, 4}, {2, 2, 2, 2, 2}, {{1, 2, 1}, {1, 0, 1}, {}}); }

TEST(ConvGrad, Depthwise) {
  check_conv({1, 3, 5, 5}, {6, 1, 3, 3}, {{2, 2}, {1, 1}, {}, PadMode::explicit_, 3});
}

// The f32 gradients run through oneDNN (conv_transpose, backward weights): same values as f64.
TEST(ConvGrad, F32MatchesF64) {
  const Array x = random_array({2, 4, 7, 6}, f64), w = random_array({6, 2, 3, 2}, f64);
  const ConvOptions o{{2, 1}, {1, 0, 2, 1}, {1, 2}, PadMode::explicit_, 2};
  auto grads = [&](DType t) {
    Graph g;
    auto px = g.placeholder(x.shape(), t, "x");
    auto pw = g.placeholder(w.shape(), t, "w");
    auto y = conv2d(px, pw, std::nullopt, o);
    return eval(g, gradients(sum(y * y), {px, pw}), {{px, x.astype(t)}, {pw, w.astype(t)}});
  };
  const auto g32 = grads(f32), g64 = grads(f64);
  for (int i = 0; i < 2; ++i) expect_close(g32[i], g64[i].shape(), to_f64(g64[i]), 1e-4, 1e-4);
}

TEST(ConvTransposeGrad, ConvTranspose2dStrideOutputPaddingGroups) {
  check_conv_transpose({1, 4, 3, 3}, {4, 2, 3, 3}, {{2, 3}, {0, 1, 1, 2}, {1, 2}, {1, 2}, 2});
  check_conv_transpose({1, 2, 3, 2}, {2, 3, 2, 2}, {}, false);
}

TEST(ConvTransposeGrad, ConvTranspose1dAnd3d) {
  check_conv_transpose({2, 3, 4}, {3, 2, 3}, {{2}, {1}, {1}});
  check_conv_transpose({1, 2, 2, 3, 2}, {2, 2, 2, 2, 2}, {{2, 1, 2}, {0, 1, 0}, {1, 0, 0}});
}

TEST(ConvTransposeGrad, OutputPaddingAtLeastTheStride) {
  // allowed below the dilation: x's gradient conv covers more than x and is cropped
  check_conv_transpose({1, 2, 3, 3}, {2, 3, 3, 3}, {{1, 1}, {}, {1, 1}, {2, 2}});
}

TEST(ConvTransposeGrad, Depthwise) {
  check_conv_transpose({1, 3, 3, 4}, {3, 2, 2, 3}, {{2, 2}, {1, 0}, {1, 0}, {}, 3});
}

// Both inputs: dy's shape is the conv output of x for a weight of `ws`.
void check_grad_weight(const Shape& xs, const Shape& ys, const Shape& ws, const ConvOptions& o) {
  SCOPED_TRACE(::testing::Message()
               << "conv_grad_weight x " << to_string(xs) << " dy " << to_string(ys));
  check_gradients([&](const std::vector<Tensor>& x) { return conv_grad_weight(x[0], x[1], ws, o); },
                  {random_array(xs, f64), random_array(ys, f64)});
}

TEST(ConvGradWeightGrad, FiniteDifferences) {
  check_grad_weight({2, 4, 6}, {2, 6, 3}, {6, 2, 3}, {{2}, {1, 1}, {}, PadMode::explicit_, 2});
  check_grad_weight({1, 2, 5, 5}, {1, 3, 4, 2}, {3, 2, 3, 2}, {{1, 2}, {0, 1, 1, 0}, {1, 2}});
}

TEST(ConvGradWeightGrad, SecondDerivativeOfConv) {
  // d/dx of sum(dW * v) where dW = d(sum(conv(x, w) * u))/dw: goes through ConvGradWeight's rule
  check_gradients(
      [](const std::vector<Tensor>& x) {
        auto y = conv2d(x[0], x[1], std::nullopt, {{2, 1}, {1, 0}});
        return gradients(sum(y * y), {x[1]})[0];
      },
      {random_array({1, 2, 5, 4}, f64), random_array({3, 2, 2, 2}, f64)});
}

}  // namespace
}  // namespace kiln
