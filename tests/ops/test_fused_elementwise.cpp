// fused_elementwise, the node the fuse_elementwise pass builds: a program run directly against a
// float64 reference, and malformed programs rejected by inference with the instruction named.
#include "core/graph_impl.h"
#include "ops/fused_elementwise.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using fused::Instr;

Tensor fused_node(const std::vector<Tensor>& ins, const fused::Program& p) {
  return detail::make_node1(OpId::FusedElementwise, ins, fused::encode(p));
}

// %0 a (8, 33), %1 b (33), %2 c () -> relu(a * b + c) < 0.5 ? elu(.., 0.3) : a
fused::Program example(DType t) {
  fused::Program p;
  p.num_inputs = 3;
  p.instrs = {{OpId::Mul, t, 0, 1},        {OpId::Add, t, 3, 2},
              {OpId::Relu, t, 4},          {OpId::Elu, t, 5, -1, -1, 0.3},
              {OpId::Less, boolean, 5, 2}, {OpId::Where, t, 7, 6, 0}};
  return p;
}

TEST(FusedElementwise, MatchesFloat64Reference) {
  for (DType t : {f32, f64, f16, bf16}) {
    SCOPED_TRACE(name(t));
    Graph g;
    auto a = g.placeholder({8, 33}, t, "a");
    auto b = g.placeholder({33}, t, "b");
    auto c = g.placeholder({}, t, "c");
    auto out = fused_node({a, b, c}, example(t));
    EXPECT_EQ(out.dtype(), t);
    EXPECT_EQ(out.shape(), (Shape{8, 33}));
    const Array av = random_array({8, 33}, t, -2, 2), bv = random_array({33}, t, -2, 2),
                cv = random_array({}, t, 0, 1);
    const Array got = eval1(g, out, {{a, av}, {b, bv}, {c, cv}});
    const auto A = to_f64(av), B = to_f64(bv), C = to_f64(cv);
    std::vector<double> want(A.size());
    // every instruction rounds to the dtype, so the branch sees the rounded value
    auto rnd = [t](double v) {
      if (t == f16)
        return static_cast<double>(static_cast<float>(float16_t(static_cast<float>(v))));
      if (t == bf16)
        return static_cast<double>(static_cast<float>(bfloat16_t(static_cast<float>(v))));
      return t == f32 ? static_cast<double>(static_cast<float>(v)) : v;
    };
    for (size_t i = 0; i < A.size(); ++i) {
      const double r = std::max(rnd(rnd(A[i] * B[i % 33]) + C[0]), 0.0);
      want[i] = r < C[0] ? (r > 0 ? r : 0.3 * std::expm1(r)) : A[i];
    }
    // half types round after every instruction
    const double tol = t == f16 ? 1e-2 : t == bf16 ? 6e-2 : tolerance(t) * 10;
    expect_close(got, {8, 33}, want, tol, tol);
  }
}

TEST(FusedElementwise, RejectsMalformedPrograms) {
  Graph g;
  auto a = g.placeholder({4}, f32, "a");
  auto k = g.placeholder({4}, i32, "k");
  auto build = [&](const fused::Program& p) { return fused_node({a, k}, p); };
  fused::Program p;
  p.num_inputs = 2;
  p.instrs = {{OpId::Add, f32, 0, 5}};
  expect_error<ValueError>([&] { build(p); }, {"[fused_elementwise] instruction 0", "%5"});
  p.instrs = {{OpId::Matmul, f32, 0, 0}};
  expect_error<ValueError>([&] { build(p); }, {"instruction 0", "not a fusable"});
  p.instrs = {{OpId::Add, f32, 0, 1}};  // f32 + i32: the add's own inference rejects it
  expect_error<ValueError>([&] { build(p); }, {"instruction 0", "add"});
  p.instrs = {{OpId::Exp, f32, 0}, {OpId::Neg, i32, 2}};  // neg of an f32 recorded as i32
  expect_error<ValueError>([&] { build(p); }, {"instruction 1", "records i32"});
  p.instrs = {{OpId::Exp, f32, 0, 1}};  // a unary op with a second operand
  expect_error<ValueError>([&] { build(p); }, {"instruction 0", "takes 1 operands"});
  p.instrs = {{OpId::Gelu, f32, 0, -1, -1, 2}};
  expect_error<ValueError>([&] { build(p); }, {"instruction 0", "flag of 0 or 1"});
  p.instrs = {{OpId::Clip, f32, 0, -1, -1, 1, -1}};  // min > max
  expect_error<ValueError>([&] { build(p); }, {"instruction 0", "clip"});
  // raw attributes of the wrong sizes or values
  auto raw = [&](std::vector<int64_t> code, std::vector<double> params) {
    Attrs at;
    at.set("code", code);
    at.set("params", params);
    return detail::make_node1(OpId::FusedElementwise, {a, k}, at);
  };
  expect_error<ValueError>([&] { raw({33, 0, 0, -1}, {0, 0}); }, {"5 ints per instruction"});
  expect_error<ValueError>([&] { raw({33, 0, 0, -1, -1}, {0}); }, {"2 floats per instruction"});
  expect_error<ValueError>([&] { raw({9999, 0, 0, -1, -1}, {0, 0}); }, {"op id 9999"});
  expect_error<ValueError>([&] { raw({33, 42, 0, -1, -1}, {0, 0}); }, {"dtype 42"});
  expect_error<ValueError>([&] { raw({}, {}); }, {"code must hold"});
}

TEST(FusedElementwise, TextIsStable) {
  const std::string s = fused::text(example(f32), {f32, f32, f32});
  EXPECT_EQ(s.find("%3 = mul.f32(%0, %1)"), s.find("%3 ="));
  EXPECT_NE(s.find("elu.f32(%5; alpha=0.3)"), std::string::npos) << s;
  EXPECT_EQ(s, fused::text(example(f32), {f32, f32, f32}));
  EXPECT_NE(s, fused::text(example(f64), {f64, f64, f64}));
}

}  // namespace
}  // namespace kiln
