// The fuse_attention pass: attention written out as exporters write it becomes one
// scaled_dot_product_attention node; results against the graph as written and a float64
// reference; what must stay unfused; and autocast running the fused attention low.
#include <fmt/format.h>

#include <cmath>

#include "passes/program.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int count(const Executable& e, OpId op) {
  int n = 0;
  for (const detail::Node& nd : e.impl().program.graph.nodes) n += nd.op == op;
  return n;
}

constexpr int64_t B = 2, H = 3, L = 5, E = 8;

// float64 softmax(s · q kᵀ + mask) v over (B, H, L, E), mask (B, 1, 1, L) or none.
std::vector<double> reference(const Array& q, const Array& k, const Array& v, const Array* mask,
                              double s) {
  const auto qv = to_f64(q), kv = to_f64(k), vv = to_f64(v);
  const std::vector<double> mv = mask ? to_f64(*mask) : std::vector<double>{};
  std::vector<double> out(B * H * L * E, 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> w(L);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < L; ++j) {
        double d = 0;
        for (int64_t e = 0; e < E; ++e) d += qv[(bh * L + i) * E + e] * kv[(bh * L + j) * E + e];
        w[j] = s * d + (mask ? mv[(bh / H) * L + j] : 0.0);
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) sum += x = std::exp(x - mx);
      for (int64_t j = 0; j < L; ++j)
        for (int64_t e = 0; e < E; ++e)
          out[(bh * L + i) * E + e] += w[j] / sum * vv[(bh * L + j) * E + e];
    }
  return out;
}

// ONNX's export of F.scaled_dot_product_attention: q and kᵀ each times sqrt(scale), the product,
// + mask, softmax, times v; the older form: the product over sqrt(E), + mask; no mask; and the
// dynamo exporter's: kᵀ as reshape, 3-D transpose, reshape, and the softmax's NaNs made zeros;
// the torchscript exporter's: kᵀ in one transpose from k laid out (B, L, H, E).
TEST(FuseAttention, ExportedFormsBecomeOneNode) {
  for (int form : {0, 1, 2, 3, 4}) {
    SCOPED_TRACE(fmt::format("form {}", form));
    Graph g;
    auto q = g.placeholder({B, H, L, E}, f32, "q");
    auto k = g.placeholder({B, H, L, E}, f32, "k");
    auto v = g.placeholder({B, H, L, E}, f32, "v");
    auto mask = g.placeholder({B, 1, 1, L}, f32, "mask");
    const double s = 1 / std::sqrt(static_cast<double>(E));
    Tensor scores;
    if (form == 0) {
      auto r = g.constant(Array::scalar(static_cast<float>(std::sqrt(s))));
      scores = matmul(q * r, transpose(k, {0, 1, 3, 2}) * r) + mask;
    } else if (form == 1) {
      scores = matmul(q, transpose(k, {0, 1, 3, 2})) / std::sqrt(static_cast<double>(E)) + mask;
    } else if (form == 2) {
      scores = matmul(q, transpose(k, {0, 1, 3, 2})) * s;  // no mask
    } else if (form == 3) {
      auto r = g.constant(Array::scalar(static_cast<float>(std::sqrt(s))));
      auto kt = reshape(transpose(reshape(k, {B * H, L, E}), {0, 2, 1}), {B, H, E, L});
      scores = matmul(q * r, kt * r) + mask;
    } else {
      auto r = g.constant(Array::scalar(static_cast<float>(std::sqrt(s))));
      auto k_blhe = transpose(k, {0, 2, 1, 3});  // as a model holds it before splitting heads
      scores = matmul(q * r, transpose(k_blhe, {0, 2, 3, 1}) * r) + mask;
    }
    Tensor probs = softmax(scores, -1);
    if (form == 3) probs = where(isnan(probs), g.constant(Array::scalar(0.0f)), probs);
    auto out = matmul(probs, v);
    Executable fused = g.compile(Device::cpu(), {}, {out});
    Executable plain = g.compile(Device::cpu(), {}, {out}, {.optimize = false});
    EXPECT_EQ(count(fused, OpId::ScaledDotProductAttention), 1) << fused.dump();
    EXPECT_EQ(count(fused, OpId::Softmax), 0) << fused.dump();
    EXPECT_EQ(count(fused, OpId::Matmul), 0) << fused.dump();
    const Array qa = random_array({B, H, L, E}, f32), ka = random_array({B, H, L, E}, f32),
                va = random_array({B, H, L, E}, f32);
    Array ma = random_array({B, 1, 1, L}, f32, -3, 0);
    ma.data<float>()[1] = -1e9f;  // a key masked out, as padding is
    const Feeds f{{q, qa}, {k, ka}, {v, va}, {mask, ma}};
    const Array got = fused.run(f)[0];
    const auto want = reference(qa, ka, va, form == 2 ? nullptr : &ma, s);
    expect_close(got, {B, H, L, E}, want, 1e-5, 1e-6);
    expect_close(got, {B, H, L, E}, to_f64(plain.run(f)[0]), 1e-5, 1e-6);
  }
}

// The probabilities read elsewhere (returned, or by a gradient), a softmax over another axis, or
// a product that is not q kᵀ: nothing changes.
TEST(FuseAttention, LeavesOtherGraphsAlone) {
  Graph g;
  auto q = g.placeholder({B, H, L, E}, f32, "q");
  auto k = g.placeholder({B, H, L, E}, f32, "k");
  auto v = g.placeholder({B, H, L, E}, f32, "v");
  auto kt = transpose(k, {0, 1, 3, 2});
  auto probs = softmax(matmul(q, kt), -1);
  auto out = matmul(probs, v);
  EXPECT_EQ(count(g.compile(Device::cpu(), {}, {out, probs}), OpId::ScaledDotProductAttention), 0);
  auto other_axis = matmul(softmax(matmul(q, kt), 2), v);
  EXPECT_EQ(count(g.compile(Device::cpu(), {}, {other_axis}), OpId::ScaledDotProductAttention), 0);
  auto w = g.placeholder({E, L}, f32, "w");
  auto no_transpose = matmul(softmax(matmul(q, w), -1), v);  // q · w: no transposed k
  EXPECT_EQ(count(g.compile(Device::cpu(), {}, {no_transpose}), OpId::ScaledDotProductAttention),
            0);
  auto grads = gradients(sum(out), {q});  // training: the backward pass reads the probabilities
  EXPECT_EQ(count(g.compile(Device::cpu(), {}, {out, grads[0]}), OpId::ScaledDotProductAttention),
            0);
}

// Under autocast the fused attention runs in bf16: q, k, v and the float mask cast, the result
// cast back, within bf16's error of the float64 reference.
TEST(FuseAttention, AutocastRunsItLow) {
  Graph g;
  auto q = g.placeholder({B, H, L, E}, f32, "q");
  auto k = g.placeholder({B, H, L, E}, f32, "k");
  auto v = g.placeholder({B, H, L, E}, f32, "v");
  auto mask = g.placeholder({B, 1, 1, L}, f32, "mask");
  auto out = matmul(softmax(matmul(q, transpose(k, {0, 1, 3, 2})) * 0.25 + mask, -1), v);
  Executable e = g.compile(Device::cpu(), {}, {out}, {.autocast = bf16});
  int low = 0;
  for (const detail::Node& n : e.impl().program.graph.nodes)
    if (n.op == OpId::ScaledDotProductAttention) {
      ++low;
      for (auto in : n.inputs) EXPECT_EQ(e.impl().program.graph.info(in).dtype, bf16);
      EXPECT_EQ(n.outputs[0].dtype, bf16);
    }
  EXPECT_EQ(low, 1) << e.dump();
  const Array qa = random_array({B, H, L, E}, f32), ka = random_array({B, H, L, E}, f32),
              va = random_array({B, H, L, E}, f32), ma = random_array({B, 1, 1, L}, f32, -2, 0);
  const Array got = e.run({{q, qa}, {k, ka}, {v, va}, {mask, ma}})[0];
  EXPECT_EQ(got.dtype(), f32);
  expect_close(got, {B, H, L, E}, reference(qa, ka, va, &ma, 0.25), 3e-2, 3e-2);
}

}  // namespace
}  // namespace kiln
