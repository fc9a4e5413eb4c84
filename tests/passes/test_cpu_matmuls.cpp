// The CPU's products with constant weights (mark_cpu_const_weights): matmul and linear nodes whose
// weight is a constant matrix get const_weight, and their kernel lays the weight out for oneDNN's
// primitive once (kept with the node) instead of reading it plain at every run; a matmul whose B
// is one matrix runs A's batches as rows of one product. Each result is checked against the same
// graph in f64 without optimization (kiln's loops, not oneDNN), and against variable weights,
// which are read at every run.
#include <thread>

#include "backends/cpu/dnnl_util.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// The products of the executable's program that carry const_weight.
int marked(const Executable& exe) {
  int n = 0;
  for (const detail::Node& node : exe.impl().program.graph.nodes)
    n +=
        (node.op == OpId::Matmul || node.op == OpId::Linear) && node.attrs.b("const_weight", false);
  return n;
}

struct Products {
  Tensor x, y;
};

// linear(x, w1, b1) then matmul with w2: x (batch..., K), w1 (N, K) and w2 (N, P), constants (or
// variables named w1 and w2), in dtype t
Products build(Graph& g, DType t, const Shape& x_shape, const Array& w1, const Array& b1,
               const Array& w2, bool variables) {
  auto weight = [&](const Array& a, const char* name) {
    return variables ? g.variable(a.astype(t), name) : g.constant(a.astype(t), name);
  };
  Products m;
  m.x = g.placeholder(x_shape, t, "x");
  const Tensor h = linear(m.x, weight(w1, "w1"), g.constant(b1.astype(t), "b1"));
  m.y = matmul(h, weight(w2, "w2"));
  return m;
}

const Shape kWeights1{48, 40}, kWeights2{48, 72};

// The products' weights and bias, fresh random values in f64.
struct Weights {
  Array w1 = random_array(kWeights1, f64), b1 = random_array({48}, f64),
        w2 = random_array(kWeights2, f64);
};

Products build(Graph& g, DType t, const Shape& x_shape, const Weights& w, bool variables) {
  return build(g, t, x_shape, w.w1, w.b1, w.w2, variables);
}

Array reference(const Shape& x_shape, const Array& x, const Array& w1, const Array& b1,
                const Array& w2) {
  Graph g;
  const Products m = build(g, f64, x_shape, w1, b1, w2, false);
  auto plain = g.compile(Device::cpu(), {}, {m.y}, CompileOptions{.optimize = false});
  return plain.run({{m.x, x}})[0];
}

// Sizes past kSmallGemm (oneDNN's path), batches of A as rows and a dynamic row count: each run
// agrees with the f64 loops, and both products carry const_weight.
TEST(CpuMatmuls, ConstantWeightsArePackedAndMatchTheF64Loops) {
  const Array w1 = random_array(kWeights1, f64), b1 = random_array({48}, f64),
              w2 = random_array(kWeights2, f64);
  for (const Shape& shape : {Shape{300, 40}, Shape{3, 70, 40}, Shape{2, 2, 90, 40}}) {
    SCOPED_TRACE(to_string(shape));
    Graph g;
    const Products m = build(g, f32, shape, w1, b1, w2, false);
    auto exe = g.compile(Device::cpu(), {}, {m.y});
    EXPECT_EQ(marked(exe), 2) << exe.dump();
    for (int run = 0; run < 2; ++run) {  // the second run reads the weights laid out by the first
      const Array xv = random_array(shape, f64);
      const Array want = reference(shape, xv, w1, b1, w2);
      expect_close(exe.run({{m.x, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-5, 1e-5);
    }
  }
  // one executable over row counts that change from call to call: its specializations (one a
  // shape) share one laid-out copy of each weight, made by the first run (at most one a weight:
  // where oneDNN's primitive takes a weight as it is, as its AVX2 kernels can, none is made)
  Graph g;
  const Products m = build(g, f32, {-1, 40}, w1, b1, w2, false);
  auto exe = g.compile(Device::cpu(), {}, {m.y});
  const size_t laid_out = cpu::dnnl_util::weights_laid_out();
  size_t first = 0;
  bool ran = false;
  for (int64_t rows : {300, 17, 1000, 400, 300}) {
    const Array xv = random_array({rows, 40}, f64);
    const Array want = reference({rows, 40}, xv, w1, b1, w2);
    expect_close(exe.run({{m.x, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-5, 1e-5);
    if (!ran) first = cpu::dnnl_util::weights_laid_out() - laid_out;
    ran = true;
  }
  EXPECT_LE(first, 2u);
  EXPECT_EQ(cpu::dnnl_util::weights_laid_out() - laid_out, first);
}

// bf16 (oneDNN's native bf16 products, f32 sums): the packed weights give what the same graph
// gives unoptimized (plain weights), within a bf16 rounding of each result.
TEST(CpuMatmuls, Bf16ConstantWeightsMatchPlainOnes) {
  const Shape shape{3, 70, 40};
  Graph g;
  const Products m = build(g, bf16, shape, Weights{}, false);
  auto exe = g.compile(Device::cpu(), {}, {m.y});
  EXPECT_EQ(marked(exe), 2) << exe.dump();
  auto plain = g.compile(Device::cpu(), {}, {m.y}, CompileOptions{.optimize = false});
  EXPECT_EQ(marked(plain), 0);
  const Array xv = random_array(shape, f64).astype(bf16);
  const Array want = plain.run({{m.x, xv}})[0];
  expect_close(exe.run({{m.x, xv}})[0], want.shape(), to_f64(want), 2e-2, 1e-2);
}

// Variables are not constants: no const_weight, and a written variable is what the next run uses.
TEST(CpuMatmuls, VariableWeightsAreReadEveryRun) {
  const Array w1 = random_array(kWeights1, f64), b1 = random_array({48}, f64),
              w2 = random_array(kWeights2, f64), w2b = random_array(kWeights2, f64);
  const Shape shape{300, 40};
  const Array xv = random_array(shape, f64);
  Graph g;
  const Products m = build(g, f32, shape, w1, b1, w2, true);
  auto exe = g.compile(Device::cpu(), {}, {m.y});
  EXPECT_EQ(marked(exe), 0) << exe.dump();
  exe.run({{m.x, xv.astype(f32)}});
  exe.write_variable("w2", w2b.astype(f32));
  const Array want = reference(shape, xv, w1, b1, w2b);
  expect_close(exe.run({{m.x, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-5, 1e-5);
}

// A package keeps const_weight; loaded, it gives the same bits. Runs from several threads share
// the weights laid out once.
TEST(CpuMatmuls, PackagesAndConcurrentRuns) {
  const Weights w;
  const Shape shape{2, 150, 40};
  Graph g;
  const Products m = build(g, f32, shape, w, false);
  auto exe = g.compile(Device::cpu(), {}, {m.y});
  const std::string path = ::testing::TempDir() + "cpu_matmuls.kiln";
  exe.save(path);
  const Executable loaded = Executable::load(path, Device::cpu());
  EXPECT_EQ(marked(loaded), 2) << loaded.dump();
  std::vector<Array> xs, wants, gots(4), loaded_gots(4);
  for (int i = 0; i < 4; ++i) {
    xs.push_back(random_array(shape, f64));
    wants.push_back(reference(shape, xs.back(), w.w1, w.b1, w.w2));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      gots[i] = exe.run({{m.x, xs[i].astype(f32)}})[0];
      loaded_gots[i] = loaded.run({{"x", xs[i].astype(f32)}})[0];
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    expect_close(gots[i], wants[i].shape(), to_f64(wants[i]), 1e-5, 1e-5);
    EXPECT_EQ(gots[i].to_vector<float>(), loaded_gots[i].to_vector<float>());
  }
}

}  // namespace
}  // namespace kiln
