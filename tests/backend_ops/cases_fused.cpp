// Cases of fused_elementwise (programs built here as the fuse_elementwise pass builds them).
#include "backend_ops/harness.h"
#include "core/graph_impl.h"
#include "ops/fused_elementwise.h"

namespace kiln::harness {
namespace {

using fused::Instr;

const bool kFused = register_cases(
    {OpId::FusedElementwise, 3, [](Case& c, DType t, int i) {
       const Shape big = i == 2 ? Shape{4099} : Shape{33, 65};
       const Shape small = i == 0 ? big : i == 1 ? Shape{65} : Shape{};
       fused::Program p;
       std::vector<Tensor> ins;
       if (t == boolean) {
         // (a > b) && !c over f32 inputs
         ins = {c.rand(big, f32), c.rand(small, f32), c.rand(big, boolean)};
         p.instrs = {{OpId::Greater, boolean, 0, 1},
                     {OpId::LogicalNot, boolean, 2},
                     {OpId::LogicalAnd, boolean, 3, 4}};
       } else if (!is_floating(t)) {
         // maximum(a * b + a, b) - abs(a) (small values: no overflow)
         ins = {c.ints(big, -9, 9, is_signed(t) ? t : i64),
                c.ints(small, -9, 9, is_signed(t) ? t : i64)};
         if (!is_signed(t)) {
           ins = {c.ints(big, 0, 9, t), c.ints(small, 0, 9, t)};
           p.instrs = {{OpId::Mul, t, 0, 1},
                       {OpId::Add, t, 2, 0},
                       {OpId::Maximum, t, 3, 1},
                       {OpId::Abs, t, 4}};
         } else {
           p.instrs = {{OpId::Mul, t, 0, 1},
                       {OpId::Add, t, 2, 0},
                       {OpId::Maximum, t, 3, 1},
                       {OpId::Abs, t, 0},
                       {OpId::Sub, t, 4, 5}};
         }
       } else {
         // where(a > b, tanh(a * b - b), elu(b, 0.5)) * sigmoid(a) through casts to f32 and
         // back. The branch compares the inputs themselves: a comparison of two rounded results
         // (sigmoid(a) > a * b) flips where they nearly tie, and the CPU's and the GPU's
         // sigmoid round differently.
         ins = {c.rand(big, t, -2, 2), c.rand(small, t, -2, 2)};
         p.instrs = {{OpId::Cast, f32, 0},        {OpId::Cast, f32, 1},
                     {OpId::Mul, f32, 2, 3},      {OpId::Sub, f32, 4, 3},
                     {OpId::Tanh, f32, 5},        {OpId::Elu, f32, 3, -1, -1, 0.5},
                     {OpId::Sigmoid, f32, 2},     {OpId::Greater, boolean, 2, 3},
                     {OpId::Where, f32, 9, 6, 7}, {OpId::Mul, f32, 10, 8},
                     {OpId::Cast, t, 11}};
       }
       p.num_inputs = static_cast<int>(ins.size());
       c.outs = {detail::make_node1(OpId::FusedElementwise, ins, fused::encode(p))};
       c.note("program " + fused::text(p, [&] {
                std::vector<DType> d;
                for (auto& x : ins) d.push_back(x.dtype());
                return d;
              }()));
       // float programs compute in f32 whatever their input dtype: f64 cases compare at f32's
       // tolerance (the CPU's and the GPU's tanh, exp round differently in f32)
       if (t == f64) c.tol_scale = test::tolerance(f32) / test::tolerance(f64);
       c.grad = false;
       return true;
     }});

}  // namespace
}  // namespace kiln::harness
