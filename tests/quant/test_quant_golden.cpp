// quantize and dequantize against numpy's results, stored by tests/quant/make_golden.py: ties
// rounding to even, saturation with NaN and infinities, per channel and per group (a short last
// block). Must match bit for bit.
#include <string>

#include "kiln/ops/quant.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Array load(const std::string& c, const std::string& what) {
  return Array::load_npy(std::string(KILN_QUANT_DATA_DIR) + "/" + c + "_" + what + ".npy");
}

void expect_same(const Array& a, const Array& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  const auto va = to_f64(a), vb = to_f64(b);
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vb[i]) << "element " << i;
}

struct GoldenCase {
  const char* name;
  QuantizeOptions o;
  bool dequant;
};

TEST(QuantGolden, MatchesNumpy) {
  for (const GoldenCase& k :
       {GoldenCase{"ties", {0, 0}, false}, GoldenCase{"u8", {0, 0}, false},
        GoldenCase{"channel", {1, 0}, true}, GoldenCase{"group", {1, 4}, true}}) {
    SCOPED_TRACE(k.name);
    const Array x = load(k.name, "x"), s = load(k.name, "scale"), zp = load(k.name, "zp");
    Graph g;
    auto px = g.placeholder(x.shape(), x.dtype(), "x");
    const Tensor q = quantize(px, g.constant(s), g.constant(zp), k.o);
    std::vector<Tensor> outs{q};
    if (k.dequant) outs.push_back(dequantize(q, g.constant(s), g.constant(zp), k.o));
    const auto y = eval(g, outs, {{px, x}});
    expect_same(y[0], load(k.name, "q"));
    if (k.dequant) expect_same(y[1], load(k.name, "dq"));
  }
}

}  // namespace
}  // namespace kiln
