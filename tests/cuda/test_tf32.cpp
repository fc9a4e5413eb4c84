// CompileOptions::allow_tf32: which nodes it marks, that the CPU ignores it (bit for bit), and on
// CUDA that f32 products and convolutions then run on TF32 tensor cores (within TF32's error of a
// float64 reference, and no longer equal to true f32), while without it they stay true f32.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/kiln.h"
#include "passes/program.h"
#include "runtime/executable_impl.h"
#include "support/gpu.h"
#include "support/nets.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const CompileOptions kTf32{.allow_tf32 = true};

// A training step's products: linear, matmul, conv, and the gradients (conv_transpose and
// conv_grad_weight among them); one int matmul that must stay unmarked.
struct Net {
  Graph g;
  Tensor x, a, loss, imat;
  std::vector<Tensor> fetch;
  Net() {
    x = g.placeholder({2, 3, 9, 9}, f32, "x");
    a = g.placeholder({4, 6}, i32, "a");
    auto w = g.variable(random_array({4, 3, 3, 3}, f32), "w");
    auto wl = g.variable(random_array({5, 4 * 7 * 7}, f32), "wl");
    auto wm = g.variable(random_array({5, 6}, f32), "wm");
    Tensor h = relu(conv2d(x, w));  // (2, 4, 7, 7)
    h = linear(reshape(h, {2, 4 * 7 * 7}), wl);
    loss = sum(tanh(matmul(h, wm)));
    imat = matmul(a, transpose(a, {1, 0}));
    fetch = {loss, imat};
    for (const Tensor& d : gradients(loss, {x, w, wl, wm})) fetch.push_back(d);
  }
};

TEST(AllowTf32, MarksTheF32ProductsAndTheCpuIgnoresIt) {
  Net n;
  Executable on = n.g.compile(Device::cpu(), {}, n.fetch, kTf32);
  Executable off = n.g.compile(Device::cpu(), {}, n.fetch);
  std::map<OpId, int> marked;
  for (const detail::Node& nd : on.impl().program.graph.nodes) {
    const bool tf32 = nd.attrs.b("tf32", false);
    if (tf32) ++marked[nd.op];
    if (nd.op == OpId::Matmul && on.impl().program.graph.info(nd.inputs[0]).dtype == i32)
      EXPECT_FALSE(tf32) << "an int matmul marked";
  }
  for (OpId op : {OpId::Conv, OpId::Linear, OpId::Matmul, OpId::ConvTranspose,
                  OpId::ConvGradWeight})
    EXPECT_GT(marked[op], 0) << op_name(op) << " not marked";
  for (const detail::Node& nd : off.impl().program.graph.nodes)
    EXPECT_FALSE(nd.attrs.b("tf32", false)) << "marked without allow_tf32";
  const Feeds f{{n.x, random_array({2, 3, 9, 9}, f32)}, {n.a, random_ints({4, 6}, -9, 9, i32)}};
  const auto got = on.run(f), want = off.run(f);
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(got[i].nbytes(), want[i].nbytes());
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].nbytes()), 0);
  }
}

// f32 inference convolutions that may use TF32 go NHWC on a CUDA target (cuDNN's tensor-core
// layout), as f16/bf16 ones do; without allow_tf32 they stay NCHW.
TEST(AllowTf32, F32ConvsGoNhwcOnCudaOnlyWithTf32) {
  Tensor x, logits;
  const Graph g = pooled_net(x, logits, f32);
  const Program p = extract_program(*logits.graph_impl(), {{logits.node_id(), 0}});
  for (bool tf32 : {true, false}) {
    SCOPED_TRACE(tf32 ? "allow_tf32" : "true f32");
    const Program q = channels_last(tf32 ? allow_tf32(p) : p, Backend::cuda);
    int convs = 0;
    for (const detail::Node& n : q.graph.nodes)
      if (n.op == OpId::Conv || n.op == OpId::FusedConv) {  // (each with its relu when NHWC)
        ++convs;
        EXPECT_EQ(n.attrs.b("channels_last", false), tf32);
      }
    EXPECT_EQ(convs, 2);
  }
}

TEST(AllowTf32, CudaF32NetMatchesTheCpu) {
  REQUIRE_GPU();
  Tensor x, logits;
  const Graph g = pooled_net(x, logits, f32);
  const Executable exe = g.compile(Device::cuda(0), {}, {logits}, kTf32);
  int nhwc = 0;
  for (const detail::Node& n : exe.impl().program.graph.nodes)
    nhwc += (n.op == OpId::Conv || n.op == OpId::FusedConv) && n.attrs.b("channels_last", false);
  EXPECT_EQ(nhwc, 2);
  for (int i = 0; i < 3; ++i) {  // the first run times the plans, the later ones replay
    const Array xv = random_array({2, 3, 20, 20}, f32);
    const Array want = g.compile(Device::cpu(), {}, {logits}).run({{x, xv}})[0];
    const Array got = exe.run({{x, xv}})[0].to(Device::cpu());
    expect_close(got, {2, 10}, to_f64(want), 2e-2, 2e-2);
  }
}

// Largest |got - want| over the largest |want|.
double rel_err(const Array& got, const std::vector<double>& want) {
  const auto g = to_f64(got);
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(g[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

TEST(AllowTf32, CudaMatmulRunsOnTf32) {
  REQUIRE_GPU();
  constexpr int64_t M = 96, K = 1024, N = 80;
  Graph g;
  auto a = g.placeholder({M, K}, f32, "a");
  auto b = g.placeholder({K, N}, f32, "b");
  auto c = matmul(a, b);
  const Array av = random_array({M, K}, f32), bv = random_array({K, N}, f32);
  const auto x = to_f64(av), y = to_f64(bv);
  std::vector<double> want(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) want[i * N + j] += x[i * K + k] * y[k * N + j];
  const Feeds f{{a, av}, {b, bv}};
  const Array strict = g.compile(Device::cuda(0), {}, {c}).run(f)[0].to(Device::cpu());
  const Array fast = g.compile(Device::cuda(0), {}, {c}, kTf32).run(f)[0].to(Device::cpu());
  const double e_strict = rel_err(strict, want), e_fast = rel_err(fast, want);
  fmt::print("matmul {}x{}x{}: relative error f32 {:.2e}, TF32 {:.2e}\n", M, K, N, e_strict,
             e_fast);
  EXPECT_LT(e_strict, 1e-5) << "f32 without allow_tf32 is not true f32";
  EXPECT_LT(e_fast, 2e-2) << "TF32 error out of its range";
  // TF32 keeps 10 mantissa bits of each input: over 1024 products the error is far above f32's
  EXPECT_GT(e_fast, 10 * e_strict) << "allow_tf32 did not reach TF32 tensor cores";
}

TEST(AllowTf32, CudaConvolutionsStayWithinTf32Error) {
  REQUIRE_GPU();
  Graph g;
  auto x = g.placeholder({4, 64, 20, 20}, f32, "x");
  auto w = g.placeholder({64, 64, 3, 3}, f32, "w");
  ConvOptions same;
  same.padding = {1, 1};
  auto y = conv2d(x, w, std::nullopt, same);
  auto grads = gradients(sum(y * y), {x, w});  // conv_transpose and conv_grad_weight
  const std::vector<Tensor> fetch{y, grads[0], grads[1]};
  const Feeds f{{x, random_array({4, 64, 20, 20}, f32)}, {w, random_array({64, 64, 3, 3}, f32)}};
  const auto ref = g.compile(Device::cpu(), {}, fetch).run(f);  // true f32 (oneDNN)
  auto run = [&](const CompileOptions& o) {
    std::vector<Array> out;
    for (const Array& a : g.compile(Device::cuda(0), {}, fetch, o).run(f))
      out.push_back(a.to(Device::cpu()));
    return out;
  };
  const auto strict = run({}), fast = run(kTf32);
  const char* names[] = {"conv", "conv_transpose (dx)", "conv_grad_weight (dw)"};
  for (size_t i = 0; i < fetch.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const auto want = to_f64(ref[i]);
    const double e_strict = rel_err(strict[i], want), e_fast = rel_err(fast[i], want);
    fmt::print("{}: relative error against the CPU, f32 {:.2e}, TF32 {:.2e}\n", names[i],
               e_strict, e_fast);
    EXPECT_LT(e_strict, 1e-4);
    EXPECT_LT(e_fast, 2e-2);
  }
}

}  // namespace
}  // namespace kiln
