// Fusion decided once for every shape of a dynamic executable: on its symbolic program, identity
// broadcasts (equal symbolic shapes) are dropped and elementwise chains over symbolic dims fused
// (fuse_for_any_shape); each specialization then only groups its small values. Checked on the
// passes (what is dropped and fused, and that the fused program instantiates at other sizes) and
// end to end (a new shape's first call runs no chain fusion; results against float64 loops).
#include <fmt/format.h>

#include <cmath>

#include "core/graph_impl.h"
#include "core/sym_dim.h"
#include "passes/program.h"
#include "runtime/run_kernel.h"
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int count_ops(const Program& p, OpId op) {
  int c = 0;
  for (const detail::Node& n : p.graph.nodes) c += n.op == op;
  return c;
}

Program program_of(const std::vector<Tensor>& outs) {
  std::vector<detail::ValueRef> refs;
  for (const Tensor& t : outs) refs.push_back({t.node_id(), t.output_index()});
  return extract_program(*outs[0].graph_impl(), refs);
}

// (b, s, 8) inputs x and a reshape of z (b*s, 8) to x's shape: symbolically one shape.
struct Chain {
  Graph g;
  Tensor x, z, row, y;
  Array bias = random_array({8}, f32);
  Chain() {
    x = g.placeholder({-1, -1, 8}, f32, "x");
    z = g.placeholder({-1, 8}, f32, "z");
    row = g.placeholder({1, 1, 8}, f32, "row");
    const Tensor same = expand(x, shape_of(x));  // an identity broadcast at every size
    const Tensor zr = reshape_to(z, shape_of(x));
    y = tanh(same * 2.0 + 1.0) * zr + expand(row, shape_of(x)) + g.constant(bias, "bias");
  }
};

TEST(SymbolicFusion, IdentityBroadcastsOfEqualSymbolicShapesAreDropped) {
  Chain c;
  Program p = program_of({c.y});
  symbolize(p);
  ASSERT_EQ(count_ops(p, OpId::BroadcastTo), 2);
  EXPECT_TRUE(has_identity_broadcasts(p));
  const Program q = drop_identity_broadcasts(p);
  // the widening broadcast of row stays
  EXPECT_EQ(count_ops(q, OpId::BroadcastTo), 1);

  // two placeholders' unnamed dynamic dims are different symbols: no identity is assumed
  Graph g;
  auto a = g.placeholder({-1, 4}, f32, "a");
  auto b = g.placeholder({-1, 4}, f32, "b");
  const Tensor y = expand(a, shape_of(b)) + b;
  Program r = program_of({y});
  symbolize(r);
  EXPECT_FALSE(has_identity_broadcasts(r));
}

TEST(SymbolicFusion, ChainsFuseOverSymbolicDimsAndInstantiateAtEverySize) {
  Chain c;
  Program p = program_of({c.y});
  symbolize(p);
  const auto inputs = symbolic_inputs(p);
  p = drop_identity_broadcasts(p);
  const Program fused = fuse_elementwise(p, Backend::cpu, FusePhases::chains);
  // mul, add, tanh, mul, add, add: one node whose output has the symbolic shape (b, s, 8)
  EXPECT_EQ(count_ops(fused, OpId::FusedElementwise), 1);
  for (OpId op : {OpId::Mul, OpId::Add, OpId::Tanh}) EXPECT_EQ(count_ops(fused, op), 0);
  for (const detail::Node& n : fused.graph.nodes)
    if (n.op == OpId::FusedElementwise) {
      const Shape& s = n.outputs[0].shape;
      ASSERT_EQ(s.size(), 3u);
      EXPECT_TRUE(sym::is_symbolic(s[0]) && sym::is_symbolic(s[1])) << sym::str(s);
    }
  // the chains phase groups no small values; the small phase fuses no chains
  EXPECT_EQ(count_ops(fuse_elementwise(p, Backend::cpu, FusePhases::small_groups),
                      OpId::FusedElementwise),
            0);
  const NodeEvaluator eval = evaluate_node_cpu;
  for (auto [b, s] : {std::pair<int64_t, int64_t>{2, 3}, {1, 7}, {5, 1}}) {
    SCOPED_TRACE(fmt::format("({}, {})", b, s));
    std::vector<std::pair<int32_t, Shape>> shapes;
    for (const detail::Node& n : fused.graph.nodes) {
      if (n.op != OpId::Placeholder) continue;
      const std::string& name = n.name;
      shapes.emplace_back(n.origin, name == "x"   ? Shape{b, s, 8}
                                    : name == "z" ? Shape{b * s, 8}
                                                  : Shape{1, 1, 8});
    }
    const Program q = instantiate(fused, inputs, shapes, &eval);
    for (const detail::Node& n : q.graph.nodes)
      if (n.op == OpId::FusedElementwise) EXPECT_EQ(n.outputs[0].shape, (Shape{b, s, 8}));
  }
}

TEST(SymbolicFusion, ANewShapeRunsNoChainFusionAndMatchesFloat64) {
  Chain c;
  Executable exe = c.g.compile(Device::cpu(), {}, {c.y});
  ASSERT_TRUE(exe.is_dynamic());
  const std::vector<double> bias = to_f64(c.bias);
  bool first = true;
  for (auto [b, s] : {std::pair<int64_t, int64_t>{2, 3}, {1, 7}, {4, 1}, {3, 5}}) {
    SCOPED_TRACE(fmt::format("({}, {})", b, s));
    const Array xv = random_array({b, s, 8}, f32), zv = random_array({b * s, 8}, f32),
                rv = random_array({1, 1, 8}, f32);
    ProfileScope ps;
    const auto out = exe.run({{c.x, xv}, {c.z, zv}, {c.row, rv}});
    const Profile prof = ps.stop();
    int once = 0, per_shape = 0, fused_ops = 0;
    for (const ProfileSpan& sp : prof.spans) {
      once += sp.kind == SpanKind::compile && sp.name == "fuse_elementwise_chains";
      per_shape += sp.kind == SpanKind::compile && sp.name == "fuse_elementwise";
      fused_ops += sp.kind == SpanKind::op && sp.name == "fused_elementwise";
    }
    // (the first call builds the symbolic program)
    EXPECT_EQ(once, first ? 1 : 0);
    EXPECT_EQ(per_shape, 0) << "a specialization fused chains again";
    first = false;
    EXPECT_GE(fused_ops, 1) << "the chain did not run fused";
    const auto x = to_f64(xv), z = to_f64(zv), r = to_f64(rv);
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      want[i] = std::tanh(x[i] * 2.0 + 1.0) * z[i] + r[i % 8] + bias[i % 8];
    expect_close(out[0], {b, s, 8}, want, 1e-5, 1e-6);
  }
}

}  // namespace
}  // namespace kiln
