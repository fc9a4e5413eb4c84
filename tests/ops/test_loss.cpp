// SoftmaxCrossEntropy, Nll, Mse against float64 reference loops, with every reduction.
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Reduction kReductions[] = {Reduction::none, Reduction::mean, Reduction::sum};

// Reduces per-position losses like the op: mean divides by `count`.
std::vector<double> reduce(const std::vector<double>& losses, Reduction r, double count) {
  if (r == Reduction::none) return losses;
  double s = 0;
  for (double l : losses) s += l;
  return {r == Reduction::sum ? s : s / count};
}
Shape reduced_shape(const Shape& shape, Reduction r) {
  return r == Reduction::none ? shape : Shape{};
}

Shape without(Shape s, int axis) {
  s.erase(s.begin() + axis);
  return s;
}

// Per-position cross entropy: index labels have one entry per position, probabilities one per
// logit.
std::vector<double> ref_cross_entropy(const Array& logits, const Array& labels, int axis) {
  const auto x = to_f64(logits), l = to_f64(labels);
  const bool probs = labels.shape() == logits.shape();
  const AxisView s = split_axis(logits.shape(), axis);
  std::vector<double> r;
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t j = 0; j < s.inner; ++j) {
      auto at = [&](int64_t k) { return (o * s.len + k) * s.inner + j; };
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < s.len; ++k) mx = std::max(mx, x[at(k)]);
      for (int64_t k = 0; k < s.len; ++k) sum += std::exp(x[at(k)] - mx);
      const double lse = mx + std::log(sum);
      double loss = 0;
      if (probs) {
        for (int64_t k = 0; k < s.len; ++k) loss += l[at(k)] * (lse - x[at(k)]);
      } else {
        loss = lse - x[at(static_cast<int64_t>(l[o * s.inner + j]))];
      }
      r.push_back(loss);
    }
  }
  return r;
}

// Random probability rows along `axis` (each sums to 1).
Array random_probs(const Shape& shape, int axis, DType t) {
  auto v = to_f64(random_array(shape, f64, 0.05, 1));
  const AxisView s = split_axis(shape, axis);
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t j = 0; j < s.inner; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < s.len; ++k) sum += v[(o * s.len + k) * s.inner + j];
      for (int64_t k = 0; k < s.len; ++k) v[(o * s.len + k) * s.inner + j] /= sum;
    }
  }
  return Array::from_vector(v, shape).astype(t);
}

TEST(SoftmaxCrossEntropy, IndexLabelsAllReductions) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  for (auto c :
       {Case{{6, 5}, -1}, Case{{2, 4, 3}, 1}, Case{{3, 1, 7}, -1}, Case{{4, 2}, 0}, Case{{5}, 0}}) {
    const int axis = normalize_axis(c.axis, static_cast<int>(c.shape.size()));
    const Shape lshape = without(c.shape, axis);
    for (DType t : {f32, f64, bf16}) {
      for (DType lt : {i32, i64}) {
        for (Reduction r : kReductions) {
          Graph g;
          auto x = g.placeholder(c.shape, t, "x");
          auto l = g.placeholder(lshape, lt, "l");
          Array vx = random_array(c.shape, t, -3, 3);
          Array vl = random_ints(lshape, 0, c.shape[axis] - 1, lt);
          auto losses = ref_cross_entropy(vx, vl, axis);
          Array out = eval1(g, softmax_cross_entropy(x, l, r, c.axis), {{x, vx}, {l, vl}});
          EXPECT_EQ(out.dtype(), t);
          expect_close(out, reduced_shape(lshape, r),
                       reduce(losses, r, static_cast<double>(losses.size())), tolerance(t), tolerance(t) * 8);
        }
      }
    }
  }
}

TEST(SoftmaxCrossEntropy, ProbabilityLabels) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  for (auto c : {Case{{4, 7}, -1}, Case{{4, 7}, 0}, Case{{2, 3, 5}, -2}}) {
    const int axis = normalize_axis(c.axis, static_cast<int>(c.shape.size()));
    for (DType t : {f32, f64, f16}) {
      for (Reduction r : kReductions) {
        Graph g;
        auto x = g.placeholder(c.shape, t, "x");
        auto l = g.placeholder(c.shape, f64, "l");  // cast to the logits' dtype by the builder
        Array vx = random_array(c.shape, t, -3, 3), vl = random_probs(c.shape, axis, f64);
        auto losses = ref_cross_entropy(vx, vl.astype(t), axis);
        expect_close(eval1(g, softmax_cross_entropy(x, l, r, c.axis), {{x, vx}, {l, vl}}),
                     reduced_shape(without(c.shape, axis), r),
                     reduce(losses, r, static_cast<double>(losses.size())), tolerance(t), tolerance(t) * 8);
      }
    }
  }
}

TEST(SoftmaxCrossEntropy, StableForLargeLogitsAndEmpty) {
  Graph g;
  auto x = g.placeholder({3, 4}, f32, "x");
  auto l = g.placeholder({3}, i64, "l");
  Array vx = random_array({3, 4}, f32, -1000, 1000), vl = random_ints({3}, 0, 3);
  expect_close(eval1(g, softmax_cross_entropy(x, l, Reduction::none), {{x, vx}, {l, vl}}), {3},
               ref_cross_entropy(vx, vl, 1), 1e-5, 1e-3);
  auto e = g.placeholder({0, 4}, f32, "e");
  auto el = g.placeholder({0}, i64, "el");
  Feeds feeds{{e, Array::empty({0, 4}, f32)}, {el, Array::empty({0}, i64)}};
  expect_close(eval1(g, softmax_cross_entropy(e, el, Reduction::sum), feeds), {}, {0.0});
  expect_close(eval1(g, softmax_cross_entropy(e, el, Reduction::mean), feeds), {}, {NAN});
  expect_close(eval1(g, softmax_cross_entropy(e, el, Reduction::none), feeds), {0}, {});
}

TEST(SoftmaxCrossEntropy, DynamicBatch) {
  Graph g;
  auto x = g.placeholder({-1, 5}, f32, "x");
  auto l = g.placeholder({-1}, i64, "l");
  auto y = softmax_cross_entropy(x, l, Reduction::none);
  EXPECT_EQ(y.shape(), (Shape{-1}));
  Array vx = random_array({7, 5}, f32, -3, 3), vl = random_ints({7}, 0, 4);
  expect_close(eval1(g, y, {{x, vx}, {l, vl}}), {7}, ref_cross_entropy(vx, vl, 1), 2e-5, 2e-5);
  auto l8 = g.placeholder({-1}, i64, "l8");
  auto y8 = softmax_cross_entropy(x, l8);
  expect_error<ShapeError>(
      [&] {
        eval1(g, y8, {{x, vx}, {l8, random_ints({8}, 0, 4)}});
      },
      {"[softmax_cross_entropy]", "(8,)", "(7,)", "(7, 5)"});
}

TEST(SoftmaxCrossEntropy, Errors) {
  Graph g;
  auto x = g.placeholder({3, 5}, f32, "x");
  auto l4 = g.placeholder({4}, i64, "l4");
  expect_error<ShapeError>([&] { softmax_cross_entropy(x, l4); },
                           {"[softmax_cross_entropy]", "(4,)", "(3,)", "(3, 5)"});
  auto p = g.placeholder({3, 4}, f32, "p");
  expect_error<ShapeError>([&] { softmax_cross_entropy(x, p); },
                           {"[softmax_cross_entropy]", "(3, 4)", "(3, 5)"});
  auto l3 = g.placeholder({3}, i64, "l3");
  expect_error<ValueError>([&] { softmax_cross_entropy(x, l3, Reduction::mean, 2); },
                           {"[softmax_cross_entropy]", "axis 2", "(3, 5)"});
  auto lb = g.placeholder({3}, boolean, "lb");
  expect_error<DTypeError>([&] { softmax_cross_entropy(x, lb); },
                           {"[softmax_cross_entropy]", "bool", "(3, 5)"});
  auto xi = g.placeholder({3, 5}, i32, "xi");
  expect_error<DTypeError>([&] { softmax_cross_entropy(xi, l3); },
                           {"[softmax_cross_entropy]", "i32", "(3, 5)"});
  // labels are only known at run time
  Array bad = Array::from_vector<int64_t>({0, 5, 1}, {3});
  expect_error<ValueError>(
      [&] {
        eval1(g, softmax_cross_entropy(x, l3), {{x, random_array({3, 5}, f32)}, {l3, bad}});
      },
      {"[softmax_cross_entropy]", "label 5", "5 classes"});
}

// Per-position nll over (N, C, d...) with class axis 1 (0 for a single row).
std::vector<double> ref_nll(const Array& x, const Array& target, int64_t ignore, double& count) {
  const auto v = to_f64(x), t = to_f64(target);
  const AxisView s = split_axis(x.shape(), x.rank() == 1 ? 0 : 1);
  std::vector<double> r;
  count = 0;
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t j = 0; j < s.inner; ++j) {
      const auto k = static_cast<int64_t>(t[o * s.inner + j]);
      r.push_back(k == ignore ? 0 : -v[(o * s.len + k) * s.inner + j]);
      count += k != ignore;
    }
  }
  return r;
}

TEST(Nll, IgnoreIndexAndAllReductions) {
  for (Shape shape : {Shape{5, 4}, Shape{2, 3, 4, 2}, Shape{6, 1}, Shape{4}}) {
    const Shape tshape = shape.size() == 1 ? Shape{} : without(shape, 1);
    const int64_t classes = shape.size() == 1 ? shape[0] : shape[1];
    for (DType t : {f32, f64, bf16}) {
      for (int64_t ignore : {int64_t{-100}, int64_t{0}}) {
        for (Reduction r : kReductions) {
          Graph g;
          auto x = g.placeholder(shape, t, "x");
          auto tg = g.placeholder(tshape, i32, "t");
          Array vx = random_array(shape, t, -4, 0);
          // draw -1 as a stand-in for the ignored index when it is not a class
          auto draws = to_f64(random_ints(tshape, ignore < 0 ? -1 : 0, classes - 1));
          for (auto& d : draws) d = d < 0 ? static_cast<double>(ignore) : d;
          Array vt = Array::from_vector(draws, tshape).astype(i32);
          double count = 0;
          auto losses = ref_nll(vx, vt, ignore, count);
          Array out = eval1(g, nll(x, tg, r, ignore), {{x, vx}, {tg, vt}});
          expect_close(out, reduced_shape(tshape, r), reduce(losses, r, count), tolerance(t), tolerance(t) * 8);
        }
      }
    }
  }
}

TEST(Nll, AllIgnoredMeanIsNan) {
  Graph g;
  auto x = g.placeholder({3, 4}, f32, "x");
  auto t = g.placeholder({3}, i64, "t");
  Feeds feeds{{x, random_array({3, 4}, f32)},
              {t, Array::from_vector<int64_t>({-100, -100, -100}, {3})}};
  expect_close(eval1(g, nll(x, t), feeds), {}, {NAN});
  expect_close(eval1(g, nll(x, t, Reduction::sum), feeds), {}, {0.0});
}

TEST(Nll, Errors) {
  Graph g;
  auto x = g.placeholder({4, 3, 2}, f32, "x");
  auto t = g.placeholder({4, 3}, i64, "t");
  expect_error<ShapeError>([&] { nll(x, t); },
                           {"[nll]", "targets", "(4, 3)", "(4, 2)", "(4, 3, 2)"});
  auto tf = g.placeholder({4, 2}, f32, "tf");
  expect_error<DTypeError>([&] { nll(x, tf); }, {"[nll]", "f32", "(4, 2)"});
  expect_error<DTypeError>(
      [&] {
        nll(g.placeholder({4, 3}, i32, "xi"), g.placeholder({4}, i32));
      },
      {"[nll]", "i32", "(4, 3)"});
  expect_error<ShapeError>([&] { nll(g.placeholder({}, f32, "s"), g.placeholder({}, i64)); },
                           {"[nll]", "rank", "()"});
  auto x2 = g.placeholder({2, 3}, f32, "x2");
  auto t2 = g.placeholder({2}, i64, "t2");
  Array bad = Array::from_vector<int64_t>({1, 3}, {2});
  expect_error<ValueError>(
      [&] {
        eval1(g, nll(x2, t2), {{x2, random_array({2, 3}, f32)}, {t2, bad}});
      },
      {"[nll]", "label 3", "3 classes"});
}

TEST(Mse, BroadcastingAndAllReductions) {
  struct Case {
    Shape a, b, out;
  };
  for (auto c : {Case{{3, 4}, {3, 4}, {3, 4}}, Case{{3, 1}, {1, 4}, {3, 4}},
                 Case{{2, 3, 4}, {4}, {2, 3, 4}}, Case{{5}, {2, 1, 5}, {2, 1, 5}},
                 Case{{}, {6}, {6}}, Case{{100, 100}, {100, 100}, {100, 100}}}) {
    for (DType t : {f32, f64, f16}) {
      for (Reduction r : kReductions) {
        Graph g;
        auto a = g.placeholder(c.a, t, "a");
        auto b = g.placeholder(c.b, t, "b");
        Array va = random_array(c.a, t), vb = random_array(c.b, t);
        const auto fa = to_f64(va), fb = to_f64(vb);
        std::vector<double> losses;
        for (int64_t i = 0; i < numel(c.out); ++i) {
          auto idx = unravel(i, c.out);
          const double d =
              fa[broadcast_offset(idx, c.a, c.out)] - fb[broadcast_offset(idx, c.b, c.out)];
          losses.push_back(d * d);
        }
        // a sum of 10^4 squares in f16 has about 4e-3 relative error
        const double rt = r == Reduction::sum && t == f16 ? 4e-3 : tolerance(t);
        expect_close(eval1(g, mse(a, b, r), {{a, va}, {b, vb}}), reduced_shape(c.out, r),
                     reduce(losses, r, static_cast<double>(losses.size())), rt, tolerance(t));
      }
    }
  }
}

TEST(Mse, PromotesAndHandlesEmpty) {
  Graph g;
  auto a = g.placeholder({4}, i32, "a");
  auto b = g.placeholder({4}, f32, "b");
  Array va = random_array({4}, i32, -5, 5), vb = random_array({4}, f32);
  auto y = mse(a, b, Reduction::sum);
  EXPECT_EQ(y.dtype(), f32);
  const auto fa = to_f64(va), fb = to_f64(vb);
  double s = 0;
  for (int i = 0; i < 4; ++i) s += (fa[i] - fb[i]) * (fa[i] - fb[i]);
  expect_close(eval1(g, y, {{a, va}, {b, vb}}), {}, {s}, 1e-5, 1e-5);
  auto e = g.placeholder({0, 3}, f32, "e");
  auto f = g.placeholder({3}, f32, "f");
  Feeds feeds{{e, Array::empty({0, 3}, f32)}, {f, random_array({3}, f32)}};
  expect_close(eval1(g, mse(e, f), feeds), {}, {NAN});
  expect_close(eval1(g, mse(e, f, Reduction::sum), feeds), {}, {0.0});
  expect_close(eval1(g, mse(e, f, Reduction::none), feeds), {0, 3}, {});
}

TEST(Mse, Errors) {
  Graph g;
  auto a = g.placeholder({2, 3}, f32, "a");
  auto b = g.placeholder({4}, f32, "b");
  expect_error<ShapeError>([&] { mse(a, b); }, {"[mse]", "(2, 3)", "(4,)"});
  auto i = g.placeholder({2, 3}, i64, "i");
  expect_error<DTypeError>([&] { mse(i, i); }, {"[mse]", "i64", "(2, 3)"});
}

}  // namespace
}  // namespace kiln
