// Gradients of the quantization ops: dequantize's scale gradient against central differences
// (per tensor, per channel, per group with a short last block), and fake_quantize's
// straight-through gradient against the mask it is defined by.
#include <cmath>

#include "kiln/ops/quant.h"
#include "support/gradcheck.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Layout {
  Shape x;
  int64_t axis = 0, block = 0;
  bool per_tensor = true;
  Shape scale() const {
    if (per_tensor) return {};
    if (block == 0) return {x[axis]};
    Shape s = x;
    s[axis] = (x[axis] + block - 1) / block;
    return s;
  }
};

void expect_bits(const Array& a, const std::vector<double>& ref) {
  const auto v = to_f64(a);
  ASSERT_EQ(v.size(), ref.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], ref[i]) << "element " << i;
}

TEST(DequantizeGrad, ScaleMatchesFiniteDifferences) {
  for (const Layout& l : {Layout{{5, 4}, 0, 0, true}, Layout{{3, 4, 2}, 1, 0, false},
                          Layout{{4, 6}, 1, 3, false}, Layout{{3, 7}, 1, 3, false}}) {
    SCOPED_TRACE(to_string(l.x));
    const Array q = random_ints(l.x, -100, 100, i8);
    const Array zp = random_ints(l.scale(), -5, 5, i8);
    GradCheckOptions o;
    o.wrt = {0};
    check_gradients(
        [&](const std::vector<Tensor>& in) {
          return dequantize(cast(in[1], i8), in[0], cast(in[2], i8), {l.axis, l.block});
        },
        {random_array(l.scale(), f64, 0.02, 0.1), q.astype(f64), zp.astype(f64)}, o);
  }
}

TEST(FakeQuantizeGrad, StraightThroughMaskedToRange) {
  // per channel along axis 1: the cotangent passes inside [(qmin - zp) s, (qmax - zp) s]
  const Shape xs{6, 5};
  // two values past any range the scales and zero points below allow (|x| > 158 * 0.05), so
  // that some saturate whatever the draw
  std::vector<float> xv = random_array(xs, f32, -6, 6).to_vector<float>();
  xv[0] = 10;
  xv[7] = -10;
  const Array x = Array::from_vector(xv, xs);
  const Array s = random_array({5}, f64, 0.02, 0.05).astype(f32);
  const Array zp = random_ints({5}, -30, 30, i8);
  const Array w = random_nonzero(xs, f32);
  Graph g;
  auto px = g.placeholder(xs, f32, "x");
  const Tensor y =
      sum(fake_quantize(px, g.constant(s), g.constant(zp), {.axis = 1}) * g.constant(w));
  const Array gx = eval1(g, gradients(y, {px})[0], {{px, x}});
  const auto vx = to_f64(x), vs = to_f64(s), vz = to_f64(zp), vw = to_f64(w);
  std::vector<double> ref(vx.size());
  int inside = 0;
  for (size_t i = 0; i < vx.size(); ++i) {
    const size_t c = i % 5;
    const float lo = static_cast<float>(-128 - vz[c]) * static_cast<float>(vs[c]);
    const float hi = static_cast<float>(127 - vz[c]) * static_cast<float>(vs[c]);
    const bool in = vx[i] >= lo && vx[i] <= hi;
    inside += in;
    ref[i] = in ? vw[i] : 0;
  }
  EXPECT_GT(inside, 0);
  EXPECT_LT(inside, static_cast<int>(vx.size()));  // some saturate: the mask matters
  expect_bits(gx, ref);
}

}  // namespace
}  // namespace kiln
