// cond, while_loop and for_loop against loops written in float64 on the host, on fresh random
// data, on the default device; captured values, nesting, dynamic shapes and every build error.
#include <cmath>

#include "kiln/ops/control.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Array scalar_bool(bool v) { return Array::scalar(v); }
Array scalar_i64(int64_t v) { return Array::scalar(v); }
// a < b and a % b against a number (as a value of a's dtype)
Tensor lt(const Tensor& a, double b) { return less(a, scalar_like(a, b)); }
Tensor rem(const Tensor& a, double b) { return mod(a, scalar_like(a, b)); }

TEST(Cond, RunsTheBranchThePredicateTakes) {
  Graph g;
  auto pred = g.placeholder({}, boolean, "pred");
  auto x = g.placeholder({3, 4}, f32, "x");
  auto w = g.placeholder({4}, f32, "w");
  // w is captured by both branches; x is an operand
  auto out = cond(
      pred, {x},
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0] * w) + 1.0}; },
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] - w}; });
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{3, 4}));
  Array xv = random_array({3, 4}, f32), wv = random_array({4}, f32);
  const auto xs = to_f64(xv), ws = to_f64(wv);
  auto exe = g.compile(default_device(), {}, {out[0]});
  for (bool taken : {true, false, true}) {
    std::vector<double> want;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double a = static_cast<float>(xs[i] * ws[i % 4]);
      want.push_back(taken ? std::max(a, 0.0) + 1 : xs[i] - ws[i % 4]);
    }
    Array got = exe.run({{pred, scalar_bool(taken)}, {x, xv}, {w, wv}})[0].to(Device::cpu());
    expect_close(got, {3, 4}, want, 1e-6, 1e-6);
  }
}

TEST(Cond, OnlyTheBranchTakenRuns) {
  Graph g;
  auto pred = g.placeholder({}, boolean, "pred");
  auto x = g.placeholder({2}, f32, "x");
  auto idx = g.placeholder({2}, i64, "idx");
  // the else branch reads x at indices out of range: an error only when it runs
  auto out = cond(
      pred, {x, idx},
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; },
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gather(in[0], in[1], 0)}; });
  auto exe = g.compile(default_device(), {}, out);
  Array xv = random_array({2}, f32), bad = Array::from_vector<int64_t>({7, 9}, {2});
  const auto xs = to_f64(xv);
  Array got = exe.run({{pred, scalar_bool(true)}, {x, xv}, {idx, bad}})[0];
  expect_close(got.to(Device::cpu()), {2}, {2 * xs[0], 2 * xs[1]}, 1e-6, 1e-6);
  expect_error<ValueError>(
      [&] {
        exe.run({{pred, scalar_bool(false)}, {x, xv}, {idx, bad}});
      },
      {"[gather]", "7"});
}

TEST(Cond, BranchResultsMustAgree) {
  Graph g;
  auto pred = g.placeholder({}, boolean, "pred");
  auto x = g.placeholder({3, 4}, f32, "x");
  auto same = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; };
  expect_error<ShapeError>(
      [&] {
        cond(pred, {x}, same, [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{transpose(in[0], {1, 0})};
        });
      },
      {"[cond]", "result 0", "f32 (3, 4) in then_fn", "f32 (4, 3) in else_fn"});
  expect_error<ShapeError>(
      [&] {
        cond(pred, {x}, same, [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0], in[0]};
        });
      },
      {"[cond]", "then_fn gives 1 results but else_fn gives 2"});
  expect_error<DTypeError>(
      [&] {
        cond(pred, {x}, same,
             [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(in[0], f16)}; });
      },
      {"[cond]", "f32 (3, 4) in then_fn", "f16 (3, 4) in else_fn"});
  auto fpred = g.placeholder({}, f32, "fpred");
  expect_error<DTypeError>([&] { cond(fpred, {x}, same, same); },
                           {"[cond]", "the predicate must be a bool with one element", "f32 ()"});
  auto vpred = g.placeholder({2}, boolean, "vpred");
  expect_error<DTypeError>([&] { cond(vpred, {x}, same, same); },
                           {"[cond]", "bool with one element", "bool (2,)"});
  expect_error<ValueError>([&] { cond(pred, {x}, same, BodyFn{}); },
                           {"[cond]", "else_fn is empty"});
  expect_error<ValueError>(
      [&] {
        cond(pred, {x}, same,
             [](const std::vector<Tensor>&) { return std::vector<Tensor>{Tensor()}; });
      },
      {"[cond]", "else_fn result 0 is an empty Tensor"});
}

// i, x -> while i < n: i + 1, x * 0.5 + c (c and n captured)
TEST(WhileLoop, CountsAndCarriesLikeAHostLoop) {
  Graph g;
  auto n = g.placeholder({}, i64, "n");
  auto x0 = g.placeholder({5}, f32, "x0");
  auto c = g.placeholder({5}, f32, "c");
  auto i0 = g.placeholder({}, i64, "i0");
  auto out = while_loop(
      {i0, x0}, [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{less(v[0], n)}; },
      [&](const std::vector<Tensor>& v) {
        return std::vector<Tensor>{v[0] + int64_t{1}, v[1] * 0.5 + c};
      });
  ASSERT_EQ(out.size(), 2u);
  auto exe = g.compile(default_device(), {}, out);
  for (int64_t trips : {int64_t{0}, int64_t{1}, int64_t{7}}) {
    Array xv = random_array({5}, f32), cv = random_array({5}, f32);
    std::vector<double> x = to_f64(xv);
    const std::vector<double> cs = to_f64(cv);
    for (int64_t t = 0; t < trips; ++t)
      for (size_t k = 0; k < x.size(); ++k) x[k] = x[k] * 0.5 + cs[k];
    auto r = exe.run({{n, scalar_i64(trips)}, {x0, xv}, {c, cv}, {i0, scalar_i64(0)}});
    expect_equal(r[0].to(Device::cpu()), {}, {static_cast<double>(trips)});
    expect_close(r[1].to(Device::cpu()), {5}, x, 1e-5, 1e-6);
  }
}

// A loop whose trip count depends on the data: x grows until it passes a limit.
TEST(WhileLoop, StopsWhenTheDataSays) {
  Graph g;
  auto x0 = g.placeholder({}, f32, "x0");
  auto limit = g.placeholder({}, f32, "limit");
  auto out = while_loop(
      {x0}, [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{less(v[0], limit)}; },
      [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] * 1.5 + 0.25}; },
      {.max_trip_count = 1000});
  auto exe = g.compile(default_device(), {}, out);
  for (int rep = 0; rep < 3; ++rep) {
    const double start = to_f64(random_array({}, f32, 0.1, 1.0))[0];
    const double lim = to_f64(random_array({}, f32, 2.0, 400.0))[0];
    float x = static_cast<float>(start);
    while (x < static_cast<float>(lim)) x = x * 1.5f + 0.25f;
    Array got = exe.run({{x0, Array::scalar(static_cast<float>(start))},
                         {limit, Array::scalar(static_cast<float>(lim))}})[0];
    expect_close(got.to(Device::cpu()), {}, {x}, 1e-6, 1e-6);
  }
}

TEST(WhileLoop, MaxTripCountIsEnforced) {
  Graph g;
  auto i0 = g.placeholder({}, i64, "i0");
  auto out = while_loop(
      {i0}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(v[0], 100)}; },
      [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] + int64_t{1}}; },
      {.max_trip_count = 3});
  auto exe = g.compile(default_device(), {}, out);
  // 97 -> 100 in three iterations: within the limit
  expect_equal(exe.run({{i0, scalar_i64(97)}})[0].to(Device::cpu()), {}, {100});
  expect_error<ValueError>(
      [&] {
        exe.run({{i0, scalar_i64(90)}});
      },
      {"[while_loop]", "max_trip_count = 3"});
  // the executable still runs after the error
  expect_equal(exe.run({{i0, scalar_i64(99)}})[0].to(Device::cpu()), {}, {100});
  expect_error<ValueError>(
      [&] {
        while_loop(
            {i0}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(v[0], 1)}; },
            [](const std::vector<Tensor>& v) { return v; }, {.max_trip_count = -2});
      },
      {"[while_loop]", "max_trip_count", "-2"});
}

TEST(WhileLoop, BodyMustKeepTheCarriedShapesAndDtypes) {
  Graph g;
  auto i0 = g.placeholder({}, i64, "i0");
  auto x = g.placeholder({4, 8}, f32, "x");
  auto keep_going = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(v[0], 3)}; };
  expect_error<ShapeError>(
      [&] {
        while_loop({i0, x}, keep_going, [](const std::vector<Tensor>& v) {
          return std::vector<Tensor>{v[0], concat({v[1], slice(v[1], {0, 0}, {4, 1})}, 1)};
        });
      },
      {"[while_loop]", "body result 1 is f32 (4, 9) but carried value 1 is f32 (4, 8)"});
  expect_error<DTypeError>(
      [&] {
        while_loop({i0, x}, keep_going, [](const std::vector<Tensor>& v) {
          return std::vector<Tensor>{v[0], cast(v[1], f64)};
        });
      },
      {"[while_loop]", "body result 1 is f64 (4, 8) but carried value 1 is f32 (4, 8)"});
  expect_error<ShapeError>(
      [&] {
        while_loop({i0, x}, keep_going,
                   [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0]}; });
      },
      {"[while_loop]", "the body gives 1 values for 2 carried values"});
  expect_error<DTypeError>(
      [&] {
        while_loop(
            {i0, x}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[1]}; },
            [](const std::vector<Tensor>& v) { return v; });
      },
      {"[while_loop]", "cond_fn's result must be a bool with one element", "f32 (4, 8)"});
  expect_error<ValueError>(
      [&] { while_loop({}, keep_going, [](const std::vector<Tensor>& v) { return v; }); },
      {"[while_loop]", "at least one carried value"});
}

TEST(WhileLoop, BodiesMayNotAssignVariables) {
  Graph g;
  auto v = g.variable(random_array({3}, f32), "v");
  auto x = g.placeholder({3}, f32, "x");
  expect_error<ValueError>(
      [&] {
        while_loop(
            {x},
            [](const std::vector<Tensor>& c) { return std::vector<Tensor>{lt(sum(c[0]), 1.0)}; },
            [&](const std::vector<Tensor>& c) { return std::vector<Tensor>{assign(v, c[0])}; });
      },
      {"[while_loop]", "body_fn has an assign node", "may not assign variables"});
}

// An RNN written as a loop: h = tanh(h W + xs[i]) for i < n, with W and xs captured.
TEST(ForLoop, RecurrenceMatchesAHostLoop) {
  constexpr int64_t B = 2, H = 8, T = 6;
  Graph g;
  auto n = g.placeholder({}, i64, "n");
  auto h0 = g.placeholder({B, H}, f32, "h0");
  auto W = g.placeholder({H, H}, f32, "W");
  auto xs = g.placeholder({T, B, H}, f32, "xs");
  auto out = for_loop(n, {h0}, [&](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{tanh(matmul(v[1], W) + gather(xs, v[0], 0))};
  });
  auto exe = g.compile(default_device(), {}, out);
  Array hv = random_array({B, H}, f32), wv = random_array({H, H}, f32, -0.5, 0.5),
        xv = random_array({T, B, H}, f32);
  const auto w = to_f64(wv), x = to_f64(xv);
  for (int64_t steps : {int64_t{T}, int64_t{3}, int64_t{0}, int64_t{-2}}) {
    const std::vector<double> h = tanh_recurrence(to_f64(hv), w, x, B, H, steps);
    Array got = exe.run({{n, scalar_i64(steps)}, {h0, hv}, {W, wv}, {xs, xv}})[0];
    expect_close(got.to(Device::cpu()), {B, H}, h, 1e-5, 1e-5);
  }
  auto fn = g.placeholder({}, f32, "fn");
  expect_error<DTypeError>(
      [&] {
        for_loop(fn, {h0}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[1]}; });
      },
      {"[for_loop]", "the trip count must be a integer with one element", "f32 ()"});
}

// Loops inside loops: the inner body reads a value of the outermost graph (captured through the
// outer body), and a cond inside a for_loop picks by the counter.
TEST(ForLoop, NestsAndCapturesAcrossLevels) {
  Graph g;
  auto w = g.placeholder({3}, f32, "w");
  auto acc0 = g.placeholder({3}, f32, "acc0");
  auto n = g.placeholder({}, i64, "n");
  auto out = for_loop(n, {acc0}, [&](const std::vector<Tensor>& v) {
    // acc += w * (i + 1), as i + 1 inner steps of acc += w
    auto inner = for_loop(v[0] + int64_t{1}, {v[1]}, [&](const std::vector<Tensor>& u) {
      return std::vector<Tensor>{u[1] + w};
    });
    // then, on odd i, acc = -acc
    auto odd = equal(rem(v[0], 2), scalar_like(v[0], 1));
    return cond(
        odd, {inner[0]}, [](const std::vector<Tensor>& c) { return std::vector<Tensor>{-c[0]}; },
        [](const std::vector<Tensor>& c) { return std::vector<Tensor>{c[0]}; });
  });
  auto exe = g.compile(default_device(), {}, out);
  Array wv = random_array({3}, f32), av = random_array({3}, f32);
  const auto ws = to_f64(wv);
  std::vector<double> acc = to_f64(av);
  const int64_t trips = 5;
  for (int64_t i = 0; i < trips; ++i)
    for (size_t k = 0; k < acc.size(); ++k) {
      acc[k] += ws[k] * static_cast<double>(i + 1);
      if (i % 2 == 1) acc[k] = -acc[k];
    }
  Array got = exe.run({{w, wv}, {acc0, av}, {n, scalar_i64(trips)}})[0];
  expect_close(got.to(Device::cpu()), {3}, acc, 1e-5, 1e-5);
}

// One executable over inputs of any batch size: the bodies compile for each shape.
TEST(ForLoop, RunsAtEveryShapeOfADynamicExecutable) {
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "x");
  auto n = g.placeholder({}, i64, "n");
  auto out = for_loop(n, {x}, [](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{v[1] * 0.5 + cast(v[0], f32)};
  });
  auto exe = g.compile(default_device(), {}, out);
  for (int64_t b : {int64_t{2}, int64_t{5}}) {
    Array xv = random_array({b, 4}, f32);
    std::vector<double> want = to_f64(xv);
    for (int64_t i = 0; i < 4; ++i)
      for (double& e : want) e = e * 0.5 + static_cast<double>(i);
    Array got = exe.run({{x, xv}, {n, scalar_i64(4)}})[0];
    expect_close(got.to(Device::cpu()), {b, 4}, want, 1e-6, 1e-6);
  }
}

}  // namespace
}  // namespace kiln
