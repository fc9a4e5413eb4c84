// drop_identity_broadcasts: a broadcast_to whose shape came from run-time values (expand by
// shape_of, as ONNX imports with dim_params build attention's operands) is no copy once the
// executable's shapes are known; a broadcast that widens stays, and so does one that is an
// output. Results against float64 loops.
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(IdentityBroadcasts, DroppedOnceShapesAreKnown) {
  Graph g;
  auto x = g.placeholder({-1, 3}, f32, "x");
  auto r = g.placeholder({-1, 3}, f32, "r");
  auto row = g.placeholder({1, 3}, f32, "row");
  const Tensor same = expand(x, shape_of(x));    // (n, 3) -> (n, 3): no copy needed
  const Tensor wide = expand(row, shape_of(r));  // (1, 3) -> (n, 3): a real broadcast
  const Tensor y = same * 2.0 + wide;
  const Tensor out_same = expand(r, shape_of(r));  // an output itself: kept
  auto exe = g.compile(Device::cpu(), {{x, {4, 3}}, {r, {4, 3}}}, {y, out_same});
  EXPECT_EQ(count_steps(exe, "broadcast_to"), 2) << exe.dump();
  for (int run = 0; run < 2; ++run) {
    const Array xv = random_array({4, 3}, f32), rv = random_array({4, 3}, f32),
                wv = random_array({1, 3}, f32);
    const auto out = exe.run({{x, xv}, {r, rv}, {row, wv}});
    const auto xs = to_f64(xv), ws = to_f64(wv);
    std::vector<double> want;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j) want.push_back(xs[i * 3 + j] * 2.0 + ws[j]);
    expect_close(out[0], {4, 3}, want, 1e-6, 1e-6);
    expect_close(out[1], {4, 3}, to_f64(rv), 0, 0);
  }
}

}  // namespace
}  // namespace kiln
