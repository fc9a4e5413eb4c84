// Gradients through custom ops (nodes of the built-in ops custom and custom_impure): a
// registered gradient builder checked by central differences, for a pure op and an impure one,
// with two inputs, an attribute and a second output.
#include <cmath>

#include "kiln/custom_op.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

// y = scale * x^3 + x * z and, as a second output, w = sin(z), in float64 loops.
void cube_kernel(KernelContext& c, Stream&) {
  const double scale = c.attrs().f("scale");
  const int64_t n = c.in(0).numel();
  auto run = [&](auto t) {
    using T = decltype(t);
    const T *x = c.in(0).ptr<T>(), *z = c.in(1).ptr<T>();
    T *y = c.out(0).ptr<T>(), *w = c.out(1).ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      const double xv = x[i], zv = z[i];
      y[i] = static_cast<T>(scale * xv * xv * xv + xv * zv);
      w[i] = static_cast<T>(std::sin(zv));
    }
  };
  if (c.in(0).dtype == f64) run(double{});
  else run(float{});
}

std::vector<std::optional<Tensor>> cube_grad(const CustomGradContext& c) {
  const Tensor &x = c.inputs[0], &z = c.inputs[1];
  const Tensor dy = c.cotangent_or_zeros(0), dw = c.cotangent_or_zeros(1);
  const double scale = c.attrs.f("scale");
  const Tensor dx = dy * (3.0 * scale * (x * x) + z);
  const Tensor dz = dy * x + dw * cos(z);
  return {dx, dz};
}

void register_cube(const std::string& name, bool pure) {
  if (is_custom_op_registered(name)) return;
  CustomOpDef d;
  d.name = name;
  d.inputs = {{"x", {f32, f64}}, {"z", {f32, f64}}};
  d.outputs = {{"y", f32, 0}, {"w", f32, 1}};  // of x's and z's dtypes
  d.attrs = {{"scale", 1.0}};
  d.gradient = cube_grad;
  d.pure = pure;
  register_custom_op(d);
  register_custom_kernel(name, Backend::cpu, cube_kernel);
}

void check(const std::string& name) {
  for (DType t : {f64, f32}) {
    SCOPED_TRACE(kiln::name(t));
    test::GradCheckOptions o;
    if (t == f32) o.eps = 1e-3, o.atol = 2e-3, o.rtol = 2e-2;
    test::check_gradients(
        [&](Graph&, const std::vector<Tensor>& in) {
          return custom_op(name, {in[0], in[1]}, {{"scale", 0.75}});
        },
        {test::random_array({3, 5}, t), test::random_array({3, 5}, t)}, o);
  }
}

TEST(CustomGrad, BuilderMatchesFiniteDifferences) {
  register_cube("test.grad_cube", true);
  check("test.grad_cube");
}

TEST(CustomImpureGrad, BuilderMatchesFiniteDifferences) {
  register_cube("test.grad_cube_impure", false);
  check("test.grad_cube_impure");
}

}  // namespace
}  // namespace kiln
