// Cases of cond, while_loop and for_loop: small bodies of elementwise ops, products and gathers,
// with fed and computed predicates and trip counts, captured values and a loop in a loop. cond's
// cases check gradients too; the loops' cases do not (while_loop has none, and for_loop's needs
// a trip count known when the graph is built: tests/autodiff/test_control_grad.cpp).
#include <fmt/format.h>

#include "backend_ops/harness.h"
#include "kiln/ops/control.h"

namespace kiln::harness {
namespace {

const std::vector<DType> kNumeric = {f32, f16, bf16, f64, i32, i64};

Tensor lt(const Tensor& a, double b) { return less(a, scalar_like(a, b)); }
// x * 0.5 + y for floats, x + y for integers (which stay small over a few iterations)
Tensor step(const Tensor& x, const Tensor& y) {
  return is_floating(x.dtype()) ? x * 0.5 + y : x + y;
}

Tensor fed_bool(Case& c) {
  return c.input({}, boolean, [](const Shape&) {
    return Array::scalar(test::to_f64(test::random_ints({1}, 0, 1, i64))[0] > 0.5);
  });
}

const bool kCond = register_cases(
    {OpId::Cond, 2,
     [](Case& c, DType t, int i) {
       Tensor x = c.rand({3, 5}, t), y = c.rand({5}, t);
       if (i == 0) {
         c.outs = cond(
             fed_bool(c), {x},
             [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * y + in[0]}; },
             [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] - y}; });
         c.note("fed predicate; y captured");
       } else {
         c.outs = cond(
             lt(sum(x), 0), {x, y},
             [](const std::vector<Tensor>& in) {
               return std::vector<Tensor>{-in[0], in[1]};
             },
             [](const std::vector<Tensor>& in) {
               return std::vector<Tensor>{in[0] * in[0], in[1] + in[1]};
             });
         c.note("predicate from the data; two results");
       }
       return true;
     },
     kNumeric});

const bool kWhileLoop = register_cases(
    {OpId::WhileLoop, 2,
     [](Case& c, DType t, int i) {
       c.grad = false;
       if (i == 0) {
         Tensor i0 = c.ints({}, 0, 3), x = c.rand({4, 6}, t), y = c.rand({6}, t);
         c.outs = while_loop(
             {i0, x}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(v[0], 5)}; },
             [&](const std::vector<Tensor>& v) {
               return std::vector<Tensor>{v[0] + 1.0, step(v[1], y)};
             });
         c.note("counter from 0..3 to 5; y captured");
         return true;
       }
       if (!is_floating(t)) return false;
       // grows until its sum passes a limit: the trip count depends on the data
       Tensor x = c.rand({7}, t, 0.5, 1.0);
       c.outs = while_loop(
           {x}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(sum(v[0]), 60)}; },
           [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] * 1.5 + 0.25}; },
           {.max_trip_count = 100});
       c.note("data-dependent trip count");
       return true;
     },
     kNumeric});

const bool kForLoop =
    register_cases({OpId::ForLoop, 2,
                    [](Case& c, DType t, int i) {
                      c.grad = false;
                      Tensor n = c.ints({}, 0, 4);
                      Tensor h = c.rand({3, 8}, t), xs = c.rand({4, 3, 8}, t);
                      if (i == 0) {
                        c.outs = for_loop(n, {h}, [&](const std::vector<Tensor>& v) {
                          return std::vector<Tensor>{step(v[1], gather(xs, v[0], 0))};
                        });
                        c.note("h = step(h, xs[i]) for i < n in 0..4");
                        return true;
                      }
                      Tensor w = c.rand({8}, t);
                      c.outs = for_loop(n, {h}, [&](const std::vector<Tensor>& v) {
                        // an inner loop of i + 1 steps reading w from the outermost graph
                        return for_loop(v[0] + 1.0, {v[1]}, [&](const std::vector<Tensor>& u) {
                          return std::vector<Tensor>{step(u[1], w)};
                        });
                      });
                      c.note("a loop in a loop; w captured two levels up");
                      return true;
                    },
                    kNumeric});

}  // namespace
}  // namespace kiln::harness
