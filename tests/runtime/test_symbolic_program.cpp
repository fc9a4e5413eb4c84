// Dynamic executables whose passes run once: the program made symbolic (each dynamic dim an
// expression of the feeds' dims), optimized for every shape, and specialized per shape without
// running the passes again; where a dim stays unknown, each shape runs every pass as before.
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Array ints(const std::vector<int64_t>& v) {
  return Array::from_vector(v, {static_cast<int64_t>(v.size())});
}

constexpr int64_t kHeads = 4, kHeadDim = 16, kHidden = kHeads * kHeadDim;

// Self-attention of x (B, L, 64) with 4 heads of 16 (q = k = v = x), as exporters write it: the
// head split and merge reshape to shapes computed from shape_of(x).
Tensor attention_from_shapes(Graph& g, const Tensor& x) {
  const Tensor bl = slice(shape_of(x), {0}, {2});
  const Tensor split = concat({bl, g.constant(ints({kHeads, kHeadDim}))});
  const Tensor merged = concat({bl, g.constant(ints({kHidden}))});
  const Tensor h = transpose(reshape_to(x, split), {0, 2, 1, 3});  // (B, 4, L, 16)
  const Tensor s = matmul(h, transpose(h, {0, 1, 3, 2})) * 0.25;
  const Tensor o = transpose(matmul(softmax(s, -1), h), {0, 2, 1, 3});
  return reshape_to(o, merged) + x;
}

std::vector<double> ref_attention(const Array& x) {
  const auto v = to_f64(x);
  const int64_t b = x.shape()[0], l = x.shape()[1];
  std::vector<double> r(v);
  for (int64_t n = 0; n < b; ++n)
    for (int64_t hd = 0; hd < kHeads; ++hd)
      for (int64_t i = 0; i < l; ++i) {
        auto at = [&](int64_t t, int64_t e) {
          return v[(n * l + t) * kHidden + hd * kHeadDim + e];
        };
        std::vector<double> p(l);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < l; ++j) {
          double s = 0;
          for (int64_t e = 0; e < kHeadDim; ++e) s += at(i, e) * at(j, e);
          p[j] = s * 0.25;
          mx = std::max(mx, p[j]);
        }
        for (double& q : p) sum += (q = std::exp(q - mx));
        for (int64_t e = 0; e < kHeadDim; ++e) {
          double o = 0;
          for (int64_t j = 0; j < l; ++j) o += p[j] / sum * at(j, e);
          r[(n * l + i) * kHidden + hd * kHeadDim + e] += o;
        }
      }
  return r;
}

TEST(SymbolicProgram, PassesRunOnceForEveryShape) {
  Graph g;
  auto x = g.placeholder({-1, -1, kHidden}, f32, "x");
  auto exe = g.compile(default_device(), {}, {attention_from_shapes(g, x)});
  const std::pair<int64_t, int64_t> shapes[] = {{2, 5}, {1, 1}, {3, 17}, {2, 5}, {4, 9}};
  for (auto [b, l] : shapes) {
    Array v = random_array({b, l, kHidden}, f32);
    expect_close(exe.run({{x, v}})[0].to(Device::cpu()), {b, l, kHidden}, ref_attention(v), 1e-4);
    // the attention the passes found on the symbolic program runs at every shape
    bool fused = false;
    for (const auto& s : exe.placement()) fused = fused || s.op == "scaled_dot_product_attention";
    EXPECT_TRUE(fused) << "(" << b << ", " << l << ")";
  }
  const auto c = exe.shape_cache();
  EXPECT_TRUE(c.symbolic);
  EXPECT_EQ(c.misses, 4);
  EXPECT_EQ(c.symbolic_misses, 4);
  EXPECT_NE(exe.report().find("passes: once"), std::string::npos) << exe.report();
}

TEST(SymbolicProgram, NamedDimsAreOneSymbol) {
  // y = x + m where x and m share the named dim "seq": one symbol, so the add needs no broadcast
  Graph g;
  auto x = g.placeholder({-1, 8}, f32, "x", {DimSpec{.axis = 0, .name = "seq"}});
  auto m = g.placeholder({-1, 8}, f32, "m", {DimSpec{.axis = 0, .name = "seq"}});
  auto exe = g.compile(default_device(), {}, {x + m * 2.0});
  for (int64_t n : {3, 1, 6}) {
    Array a = random_array({n, 8}, f32), b = random_array({n, 8}, f32);
    std::vector<double> want = to_f64(a);
    const auto vb = to_f64(b);
    for (size_t i = 0; i < want.size(); ++i) want[i] += 2 * vb[i];
    expect_close(exe.run({{x, a}, {m, b}})[0].to(Device::cpu()), {n, 8}, want, 1e-6);
  }
  EXPECT_TRUE(exe.shape_cache().symbolic);
  EXPECT_EQ(exe.shape_cache().symbolic_misses, 3);
}

TEST(SymbolicProgram, FollowsTheExpandPatternOfExporters) {
  // PyTorch's ONNX exporter writes x.expand(b, l) as Expand(x, Where(Equal(sizes, -ones), ones,
  // sizes)) with ones = ConstantOfShape(Shape(sizes), 1): each -1 keeps a dim
  Graph g;
  auto x = g.placeholder({-1, -1}, f32, "x", {DimSpec{.axis = 0, .name = "b"}, {1, "l"}});
  const Tensor s = shape_of(x);
  const Tensor sizes = concat({slice(s, {0}, {1}), slice(s, {1}, {2})});
  const Tensor ones = full(shape_of(sizes), 1, i64);
  const Tensor keep = where(equal(sizes, ones * g.constant(ints({-1}))), ones, sizes);
  const Array row = random_array({1, 1}, f32);
  auto exe = g.compile(default_device(), {}, {expand(g.constant(row), keep) + x});
  for (auto [b, l] : {std::pair<int64_t, int64_t>{2, 3}, {4, 1}, {1, 5}}) {
    const Array xv = random_array({b, l}, f32);
    auto want = to_f64(xv);
    for (double& v : want) v += to_f64(row)[0];
    expect_close(exe.run({{x, xv}})[0].to(Device::cpu()), {b, l}, want, 1e-6);
  }
  EXPECT_TRUE(exe.shape_cache().symbolic) << exe.shape_cache().not_symbolic;
  EXPECT_EQ(exe.shape_cache().symbolic_misses, 3);
}

// Tile repeats and pads computed from shapes stay symbolic: tile by another input's length, and
// the gradient of a slice of a dynamic dim (a pad whose amounts come from the shape).
TEST(SymbolicProgram, TileAndPadFromShapesAreSymbolic) {
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "x");
  auto n = g.placeholder({-1}, f32, "n");
  auto y = tile(x, concat({shape_of(n), g.constant(ints({1}))})) * 3.0;
  auto dx = gradients(sum(slice(y * y, {1}, {-1}, {}, {0})), {x})[0];
  auto exe = g.compile(default_device(), {}, {y, dx});
  for (auto [rows, reps] : {std::pair<int64_t, int64_t>{2, 3}, {1, 4}, {3, 2}}) {
    Array a = random_array({rows, 4}, f32);
    const auto va = to_f64(a);
    std::vector<double> want, grad(va.size(), 0);
    for (int64_t r = 0; r < reps; ++r)
      for (size_t i = 0; i < va.size(); ++i) {
        want.push_back(3 * va[i]);
        // row r * rows + i / 4 of y is kept by the slice unless it is the first or the last
        const int64_t row = r * rows + static_cast<int64_t>(i) / 4;
        if (row > 0 && row < rows * reps - 1) grad[i] += 18 * va[i];  // d(3x)^2/dx
      }
    const auto out = exe.run({{x, a}, {n, random_array({reps}, f32)}});
    expect_close(out[0].to(Device::cpu()), {rows * reps, 4}, want, 1e-6);
    expect_close(out[1].to(Device::cpu()), {rows, 4}, grad, 1e-5);
  }
  EXPECT_TRUE(exe.shape_cache().symbolic) << exe.shape_cache().not_symbolic;
  EXPECT_EQ(exe.shape_cache().symbolic_misses, 3);
}

TEST(SymbolicProgram, AnUnknownDimRunsThePassesForEachShape) {
  // tile repeats computed from another input's shape through an op the symbolic program does not
  // follow (abs): each shape runs every pass, and the report says which node stopped it
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "x");
  auto n = g.placeholder({-1}, f32, "n");
  auto y = tile(x, concat({abs(shape_of(n)), g.constant(ints({1}))})) * 3.0;
  auto exe = g.compile(default_device(), {}, {y});
  for (auto [rows, reps] : {std::pair<int64_t, int64_t>{2, 3}, {1, 1}, {3, 2}}) {
    Array a = random_array({rows, 4}, f32);
    const auto va = to_f64(a);
    std::vector<double> want;
    for (int64_t r = 0; r < reps; ++r)
      for (double v : va) want.push_back(3 * v);
    expect_close(exe.run({{x, a}, {n, random_array({reps}, f32)}})[0].to(Device::cpu()),
                 {rows * reps, 4}, want, 1e-6);
  }
  EXPECT_FALSE(exe.shape_cache().symbolic);
  EXPECT_EQ(exe.shape_cache().symbolic_misses, 0);
  EXPECT_NE(exe.shape_cache().not_symbolic.find("(tile) has shape (?, ?)"), std::string::npos)
      << exe.shape_cache().not_symbolic;
  EXPECT_NE(exe.report().find("passes: again for each shape (node %"), std::string::npos)
      << exe.report();
}

TEST(SymbolicProgram, TheFirstShapeResolvesMinimaAndLaterShapesAreChecked) {
  // the rows of a table of 8 positions up to the sequence's length: min(seq, 8), which the first
  // shape (seq 5) resolves to seq; a sequence of 12 takes all 8 rows, where seq does not hold,
  // and runs the passes for itself
  Graph g;
  auto x = g.placeholder({-1, 3}, f32, "x", {DimSpec{.axis = 0, .name = "seq"}});
  const Array table = random_array({8, 3}, f32);
  const Tensor rows = slice(g.constant(table), g.constant(ints({0, 0})),
                            concat({slice(shape_of(x), {0}, {1}), g.constant(ints({3}))}));
  auto exe = g.compile(default_device(), {}, {rows * 2.0});
  const auto vt = to_f64(table);
  for (int64_t seq : {5, 2, 12, 8, 3}) {
    const int64_t taken = std::min<int64_t>(seq, 8);
    std::vector<double> want(vt.begin(), vt.begin() + taken * 3);
    for (double& v : want) v *= 2;
    expect_close(exe.run({{x, random_array({seq, 3}, f32)}})[0].to(Device::cpu()), {taken, 3}, want,
                 1e-6);
  }
  const auto c = exe.shape_cache();
  EXPECT_TRUE(c.symbolic);
  EXPECT_EQ(c.misses, 5);
  EXPECT_EQ(c.symbolic_misses, 4);  // all but 12 (at 8, min(seq, 8) is seq too)
}

}  // namespace
}  // namespace kiln
