// GELU written out becomes one gelu node (recognize_gelu), and a CPU product with the elementwise
// chain after it one fused_matmul node (fuse_cpu_matmul_epilogues): each form is checked for the
// nodes it leaves and against the same graph in f64 without optimization (kiln's loops and the
// ops' own math), at the sizes of each kernel path (small_gemm, oneDNN's product then the
// steps, oneDNN's post-ops).
#include "core/graph_impl.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int count(const Executable& exe, OpId op) {
  int n = 0;
  for (const detail::Node& node : exe.impl().program.graph.nodes) n += node.op == op;
  return n;
}

// out(x) built in f32 for the optimized executable and in f64 for the reference; x random in
// [-lo, lo] (wide enough to reach GELU's tails).
using Build = std::function<Tensor(Graph&, Tensor, DType)>;

struct Compared {
  Executable exe;
  Array got, want;
};

Compared compare(const Build& f, const Shape& shape, const CompileOptions& o, double lo = 6,
                 const Device& device = Device::cpu()) {
  Graph g;
  const Tensor x = g.placeholder(shape, f32, "x");
  const Tensor y = f(g, x, f32);
  Graph r;
  const Tensor rx = r.placeholder(shape, f64, "x");
  const Tensor ry = f(r, rx, f64);
  const Array xv = random_array(shape, f64, -lo, lo);
  Compared c{g.compile(device, {}, {y}, o), {}, {}};
  c.got = c.exe.run({{x, xv.astype(f32)}})[0];
  auto plain = r.compile(Device::cpu(), {}, {ry}, CompileOptions{.optimize = false});
  c.want = plain.run({{rx, xv}})[0];
  return c;
}

const CompileOptions kUnfused{.fuse_elementwise = false};

Tensor gelu_erf_div(Graph&, Tensor x, DType) {
  return x * 0.5 * (1.0 + erf(x / 1.4142135623730951));
}
Tensor gelu_erf_mul(Graph&, Tensor x, DType) {
  return (x * (erf(x * 0.7071067811865476) + 1.0)) * 0.5;
}
Tensor gelu_erf_half_first(Graph&, Tensor x, DType) {
  return 0.5 * (x * (1.0 + erf(x / 1.4142135623730951)));
}
Tensor gelu_tanh_pow(Graph& g, Tensor x, DType t) {
  const Tensor cube = pow(x, g.scalar(3.0, t));
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * cube)));
}
Tensor gelu_tanh_products(Graph&, Tensor x, DType) {
  return x * 0.5 * (1.0 + tanh((x + x * x * x * 0.044715) * 0.7978845608028654));
}

TEST(RecognizeGelu, EachWrittenFormBecomesOneGelu) {
  const struct {
    const char* name;
    Build f;
    bool tanh;
  } forms[] = {{"x·0.5·(1+erf(x/√2))", gelu_erf_div, false},
               {"(x·(erf(x·(1/√2))+1))·0.5", gelu_erf_mul, false},
               {"0.5·(x·(1+erf(x/√2)))", gelu_erf_half_first, false},
               {"tanh form, pow(x, 3)", gelu_tanh_pow, true},
               {"tanh form, x·x·x", gelu_tanh_products, true}};
  // on CUDA too, where one is present: the pass runs for every backend
  std::vector<Device> devices{Device::cpu()};
  if (cuda_device_count() > 0) devices.push_back(Device::cuda(0));
  for (const Device& device : devices)
    for (const auto& form : forms) {
      SCOPED_TRACE(std::string(form.name) + " on " + device.str());
      const Compared c = compare(form.f, {6, 37}, kUnfused, 6, device);
      EXPECT_EQ(count(c.exe, OpId::Gelu), 1) << c.exe.dump();
      EXPECT_EQ(count(c.exe, OpId::Erf) + count(c.exe, OpId::Tanh) + count(c.exe, OpId::Mul) +
                    count(c.exe, OpId::Add) + count(c.exe, OpId::Pow),
                0)
          << c.exe.dump();
      const detail::Node* gelu = nullptr;
      for (const auto& n : c.exe.impl().program.graph.nodes)
        if (n.op == OpId::Gelu) gelu = &n;
      ASSERT_NE(gelu, nullptr);
      EXPECT_EQ(gelu->attrs.str("approximate"), form.tanh ? "tanh" : "none");
      expect_close(c.got, c.want.shape(), to_f64(c.want), 1e-5, 1e-6);
    }
}

// A chain whose value another node reads, or a constant that is not GELU's, stays as written.
TEST(RecognizeGelu, OtherChainsStayAsWritten) {
  {
    Graph g;
    const Tensor x = g.placeholder({4, 9}, f32, "x");
    const Tensor e = erf(x / 1.4142135623730951);
    const Tensor y = x * 0.5 * (1.0 + e);
    auto exe = g.compile(Device::cpu(), {}, {y, e}, kUnfused);  // the erf is an output too
    EXPECT_EQ(count(exe, OpId::Gelu), 0) << exe.dump();
  }
  const Build not_half = [](Graph&, Tensor x, DType) {
    return x * 0.6 * (1.0 + erf(x / 1.4142135623730951));
  };
  const Build not_cube = [](Graph& g, Tensor x, DType t) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * pow(x, g.scalar(2.0, t)))));
  };
  for (const Build& f : {not_half, not_cube}) {
    const Compared c = compare(f, {5, 11}, kUnfused);
    EXPECT_EQ(count(c.exe, OpId::Gelu), 0) << c.exe.dump();
    expect_close(c.got, c.want.shape(), to_f64(c.want), 1e-5, 1e-6);
  }
}

// ---- fused_matmul ----

// A constant of `shape`, random in [-1, 1], the same values in either dtype.
Tensor weight(Graph& g, const Shape& shape, DType t, uint64_t key) {
  static std::map<std::pair<uint64_t, Shape>, Array> made;
  auto& a = made[{key, shape}];
  if (!a.valid()) a = random_array(shape, f64);
  return g.constant(a.astype(t));
}

struct Chain {
  const char* name;
  Shape x;
  int64_t n;
  std::function<Tensor(Graph&, Tensor, DType)> f;
  int steps;  // the fused node's epilogue length (0: nothing fused)
};

TEST(MatmulEpilogues, ChainsFuseAndMatchTheF64Graph) {
  // x (..., K) times a (K, N) constant, then the chain
  auto product = [](Graph& g, Tensor x, DType t, int64_t n) {
    return matmul(x, weight(g, {x.shape().back(), n}, t, 1));
  };
  std::vector<Chain> chains;
  // each chain at three sizes: small_gemm (M·N·K <= 2^18), oneDNN's product with the steps after
  // it (<= 2^22), oneDNN's post-ops
  for (const Shape& x : {Shape{8, 16}, Shape{2, 40, 96}, Shape{2, 100, 256}}) {
    const int64_t n = x.back() == 16 ? 24 : x.back() == 96 ? 72 : 192;
    chains.push_back({"bias, gelu", x, n,
                      [=](Graph& g, Tensor v, DType t) {
                        return gelu(product(g, v, t, n) + weight(g, {n}, t, 2));
                      },
                      2});
    chains.push_back({"bias, residual, relu", x, n,
                      [=](Graph& g, Tensor v, DType t) {
                        Shape rs = v.shape();
                        rs.back() = n;
                        return relu(weight(g, rs, t, 3) +
                                    (product(g, v, t, n) + weight(g, {n}, t, 2)));
                      },
                      3});
    chains.push_back({"silu gate (silu(x w1) · x w3)", x, n,
                      [=](Graph& g, Tensor v, DType t) {
                        const Tensor h = silu(product(g, v, t, n));
                        return h * matmul(v, weight(g, {v.shape().back(), n}, t, 4));
                      },
                      2});
    chains.push_back({"row scale, sigmoid, gelu tanh, one value added", x, n,
                      [=](Graph& g, Tensor v, DType t) {
                        const Tensor s = sigmoid(product(g, v, t, n) * weight(g, {1, n}, t, 5));
                        return gelu(s + weight(g, {1}, t, 6), GeluApprox::tanh);
                      },
                      4});
    chains.push_back(
        {"linear with bias, tanh", x, n,
         [=](Graph& g, Tensor v, DType t) {
           return tanh(linear(v, weight(g, {n, v.shape().back()}, t, 7), weight(g, {n}, t, 2)));
         },
         2});
  }
  for (const Chain& c : chains) {
    SCOPED_TRACE(std::string(c.name) + " " + to_string(c.x));
    const Compared r = compare(c.f, c.x, {}, 1);
    EXPECT_EQ(count(r.exe, OpId::FusedMatmul), 1) << r.exe.dump();
    for (const auto& n : r.exe.impl().program.graph.nodes)
      if (n.op == OpId::FusedMatmul) {
        EXPECT_EQ(n.attrs.ints("epilogue").size(), static_cast<size_t>(c.steps));
        EXPECT_TRUE(n.attrs.b("const_weight", false));
      }
    EXPECT_EQ(count(r.exe, OpId::Add) + count(r.exe, OpId::FusedElementwise), 0) << r.exe.dump();
    // (f32 sums of up to 256 products of magnitude 1, a gate multiplying two of them: absolute
    // errors up to about 1e-4)
    expect_close(r.got, r.want.shape(), to_f64(r.want), 1e-4, 1e-3);
  }
}

// A 2-D product reshaped back to the batch's dims between its steps (dynamo's Gemm): the fused node
// reads x reshaped and gives the last step's shape; a reshape after the last step stays out.
TEST(MatmulEpilogues, ReshapesBetweenStepsAreTakenIn) {
  const Build f = [](Graph& g, Tensor x, DType t) {
    const Tensor y = reshape(matmul(x, weight(g, {96, 72}, t, 12)), {2, 40, 72});
    return reshape(gelu(y + weight(g, {2, 40, 72}, t, 13)), {80, 72});
  };
  const Compared r = compare(f, {80, 96}, {}, 1);
  EXPECT_EQ(count(r.exe, OpId::FusedMatmul), 1) << r.exe.dump();
  for (const auto& n : r.exe.impl().program.graph.nodes)
    if (n.op == OpId::FusedMatmul) {
      EXPECT_EQ(n.outputs[0].shape, (Shape{2, 40, 72}));
      EXPECT_EQ(n.attrs.ints("epilogue").size(), 2u);
    }
  expect_close(r.got, r.want.shape(), to_f64(r.want), 1e-4, 1e-5);
}

// An operand broadcast along another dim than rows, or a product read twice, stays unfused.
TEST(MatmulEpilogues, OtherShapesAndReadersStayUnfused) {
  const Build per_batch = [](Graph& g, Tensor x, DType t) {
    return matmul(x, weight(g, {64, 48}, t, 8)) + weight(g, {3, 1, 48}, t, 9);
  };
  const Build read_twice = [](Graph& g, Tensor x, DType t) {
    const Tensor y = matmul(x, weight(g, {64, 48}, t, 8));
    return relu(y) + y;
  };
  for (const Build& f : {per_batch, read_twice}) {
    const Compared r = compare(f, {3, 20, 64}, {}, 1);
    EXPECT_EQ(count(r.exe, OpId::FusedMatmul), 0) << r.exe.dump();
    expect_close(r.got, r.want.shape(), to_f64(r.want), 1e-4, 1e-5);
  }
}

// A package keeps the fused node; loaded, it gives the same bits.
TEST(MatmulEpilogues, PackagesKeepTheFusedNode) {
  Graph g;
  const Tensor x = g.placeholder({2, 100, 256}, f32, "x");
  const Tensor y = gelu(matmul(x, weight(g, {256, 192}, f32, 10)) + weight(g, {192}, f32, 11));
  auto exe = g.compile(Device::cpu(), {}, {y});
  ASSERT_EQ(count(exe, OpId::FusedMatmul), 1) << exe.dump();
  const std::string path = ::testing::TempDir() + "matmul_epilogues.kiln";
  exe.save(path);
  const Executable loaded = Executable::load(path, Device::cpu());
  EXPECT_EQ(count(loaded, OpId::FusedMatmul), 1) << loaded.dump();
  const Array xv = random_array({2, 100, 256}, f32);
  const Array a = exe.run({{"x", xv}})[0], b = loaded.run({{"x", xv}})[0];
  expect_equal(b, a.shape(), to_f64(a));
  // loaded on a GPU, which has no kernel for the node, it runs as a CPU fallback with the same
  // results
  if (cuda_device_count() > 0) {
    const Executable on_gpu = Executable::load(path, Device::cuda(0));
    EXPECT_EQ(count(on_gpu, OpId::FusedMatmul), 1) << on_gpu.dump();
    EXPECT_NE(on_gpu.dump().find("cpu fallback"), std::string::npos) << on_gpu.dump();
    expect_close(on_gpu.run({{"x", xv}})[0], a.shape(), to_f64(a), 1e-6, 1e-7);
  }
}

// A hand-made node with an unknown step or an operand of another shape fails, naming it.
TEST(MatmulEpilogues, BadNodesFailClearly) {
  Graph g;
  const Tensor x = g.placeholder({4, 8}, f32, "x");
  const Tensor w = g.constant(random_array({8, 5}, f32));
  const Tensor bad = g.constant(random_array({3, 5}, f32));
  expect_error<ValueError>(
      [&] {
        detail::make_node1(OpId::FusedMatmul, {x, w}, {{"epilogue", std::vector<int64_t>{99}}});
      },
      {"fused_matmul", "unknown epilogue step 99"});
  expect_error<ShapeError>(
      [&] {
        detail::make_node1(OpId::FusedMatmul, {x, w, bad}, {{"epilogue", std::vector<int64_t>{1}}});
      },
      {"fused_matmul", "operand 2", "(3, 5)"});
}

}  // namespace
}  // namespace kiln
