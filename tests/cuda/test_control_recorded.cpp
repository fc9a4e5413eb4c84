// cond, while_loop and for_loop recorded into a run as CUDA conditional nodes (the loop on the
// device): from the second run on, a GPU executable holding them replays one graph. Results
// against loops written in float64 on the host, on fresh feeds every run; nesting, carried
// values that swap, conditions that are carried values, trip counts of other integer types,
// several loop steps per launch of a node's body, max_trip_count and index errors inside bodies.
// Skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/ops/control.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);

Tensor lt(const Tensor& a, double b) { return less(a, scalar_like(a, b)); }

// The executable replays its runs (its control ops became conditional nodes).
void expect_recorded(const Executable& exe, int64_t at_least) {
  EXPECT_EQ(exe.capture_status(), "recorded once, replayed from the second run");
  EXPECT_GE(exe.replayed_runs(), at_least);
}

// x = x * a + c while i < n (the condition on the device), for several n, every run replayed
// after the first.
TEST(CudaControlGraph, WhileLoopRunsOnTheDevice) {
  REQUIRE_CONDITIONAL_NODES();
  Graph g;
  auto n = g.placeholder({}, i64, "n");
  auto x0 = g.placeholder({300}, f32, "x0");
  auto c = g.placeholder({300}, f32, "c");
  auto i0 = g.placeholder({}, i64, "i0");
  auto out = while_loop(
      {i0, x0}, [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{less(v[0], n)}; },
      [&](const std::vector<Tensor>& v) {
        return std::vector<Tensor>{v[0] + int64_t{1}, v[1] * 0.75 + c};
      });
  auto exe = g.compile(kGpu, {}, out);
  int runs = 0;
  for (int64_t trips : {int64_t{4}, int64_t{0}, int64_t{1}, int64_t{37}, int64_t{4}}) {
    Array xv = random_array({300}, f32), cv = random_array({300}, f32);
    std::vector<double> x = to_f64(xv);
    const std::vector<double> cs = to_f64(cv);
    for (int64_t t = 0; t < trips; ++t)
      for (size_t k = 0; k < x.size(); ++k) x[k] = x[k] * 0.75 + cs[k];
    auto r =
        exe.run({{n, Array::scalar(trips)}, {x0, xv}, {c, cv}, {i0, Array::scalar(int64_t{0})}});
    expect_equal(r[0].to(Device::cpu()), {}, {static_cast<double>(trips)});
    expect_close(r[1].to(Device::cpu()), {300}, x, 1e-5, 1e-5);
    ++runs;
  }
  expect_recorded(exe, runs - 1);
}

// KILN_CONDITIONAL_NODES=0: the same loop is not recorded (its status says why) and runs from the
// host, with the same results.
TEST(CudaControlGraph, ConditionalNodesOffRunFromTheHost) {
  REQUIRE_RECORDED_RUNS();
  const ScopedEnv off("KILN_CONDITIONAL_NODES", "0");
  Graph g;
  auto n = g.placeholder({}, i64, "n");
  auto x0 = g.placeholder({64}, f32, "x0");
  auto out = for_loop(n, {x0}, [&](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{v[1] * 0.5 + 1.0};  // (v[0]: the counter)
  });
  auto exe = g.compile(kGpu, {}, out);
  for (int64_t trips : {int64_t{3}, int64_t{0}, int64_t{6}}) {
    Array xv = random_array({64}, f32);
    std::vector<double> x = to_f64(xv);
    for (int64_t t = 0; t < trips; ++t)
      for (double& e : x) e = e * 0.5 + 1.0;
    auto r = exe.run({{n, Array::scalar(trips)}, {x0, xv}});
    expect_close(r[0].to(Device::cpu()), {64}, x, 1e-5, 1e-5);
  }
  EXPECT_EQ(exe.replayed_runs(), 0);
  EXPECT_NE(exe.capture_status().find("KILN_CONDITIONAL_NODES=0"), std::string::npos)
      << exe.capture_status();
}

// A condition that is a carried value itself, and a body that swaps two carried values (each
// result is the other's operand): the copies at an iteration's end read before they write.
TEST(CudaControlGraph, CarriedConditionAndSwappedValues) {
  REQUIRE_CONDITIONAL_NODES();
  Graph g;
  auto a0 = g.placeholder({5, 7}, f32, "a0");
  auto b0 = g.placeholder({5, 7}, f32, "b0");
  auto i0 = g.placeholder({}, i64, "i0");
  auto n = g.placeholder({}, i64, "n");
  auto go0 = less(i0, n);
  // (go, i, a, b) -> (i + 1 < n, i + 1, b, a + 1)
  auto out = while_loop(
      {go0, i0, a0, b0}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0]}; },
      [&](const std::vector<Tensor>& v) {
        auto i = v[1] + int64_t{1};
        return std::vector<Tensor>{less(i, n), i, v[3], v[2] + 1.0};
      },
      {.max_trip_count = 100});
  auto exe = g.compile(kGpu, {}, {out[2], out[3]});
  for (int64_t trips : {int64_t{3}, int64_t{6}, int64_t{1}, int64_t{0}}) {
    Array av = random_array({5, 7}, f32), bv = random_array({5, 7}, f32);
    std::vector<double> a = to_f64(av), b = to_f64(bv);
    for (int64_t t = 0; t < trips; ++t) {
      std::vector<double> next_b = a;
      for (double& e : next_b) e += 1;
      a = b;
      b = next_b;
    }
    auto r =
        exe.run({{a0, av}, {b0, bv}, {i0, Array::scalar(int64_t{0})}, {n, Array::scalar(trips)}});
    expect_close(r[0].to(Device::cpu()), {5, 7}, a, 1e-6, 1e-6);
    expect_close(r[1].to(Device::cpu()), {5, 7}, b, 1e-6, 1e-6);
  }
  expect_recorded(exe, 3);
}

// Nested conditional nodes: a for_loop whose body holds a for_loop (its trip count computed from
// the outer counter, reading a value captured from the outermost graph) and a cond on the
// counter's parity; the outer trip count is an i32 feed.
TEST(CudaControlGraph, NestedLoopsAndBranches) {
  REQUIRE_CONDITIONAL_NODES();
  Graph g;
  auto w = g.placeholder({3, 4}, f32, "w");
  auto acc0 = g.placeholder({3, 4}, f32, "acc0");
  auto n = g.placeholder({}, i32, "n");
  auto out = for_loop(n, {acc0}, [&](const std::vector<Tensor>& v) {
    auto inner = for_loop(v[0] + int64_t{1}, {v[1]}, [&](const std::vector<Tensor>& u) {
      return std::vector<Tensor>{u[1] + w};
    });
    auto odd = equal(mod(v[0], scalar_like(v[0], 2)), scalar_like(v[0], 1));
    return cond(
        odd, {inner[0]}, [](const std::vector<Tensor>& c) { return std::vector<Tensor>{-c[0]}; },
        [&](const std::vector<Tensor>& c) { return std::vector<Tensor>{c[0] * 0.5}; });
  });
  auto exe = g.compile(kGpu, {}, out);
  for (int32_t trips : {5, 2, 0, 7}) {
    Array wv = random_array({3, 4}, f32), av = random_array({3, 4}, f32);
    const auto ws = to_f64(wv);
    std::vector<double> acc = to_f64(av);
    for (int32_t i = 0; i < trips; ++i)
      for (size_t k = 0; k < acc.size(); ++k) {
        acc[k] += ws[k] * static_cast<double>(i + 1);
        acc[k] = i % 2 == 1 ? -acc[k] : acc[k] * 0.5;
      }
    Array got = exe.run({{w, wv}, {acc0, av}, {n, Array::scalar(trips)}})[0];
    expect_close(got.to(Device::cpu()), {3, 4}, acc, 1e-5, 1e-5);
  }
  expect_recorded(exe, 3);
}

// A recurrence with a library product in the body (cuBLASLt, its workspace planned with the
// recording) and a cond whose branches read different captured values.
TEST(CudaControlGraph, ProductsInBodiesAndBranches) {
  REQUIRE_CONDITIONAL_NODES();
  constexpr int64_t B = 4, H = 32, T = 9;
  Graph g;
  auto n = g.placeholder({}, i64, "n");
  auto h0 = g.placeholder({B, H}, f32, "h0");
  auto W = g.placeholder({H, H}, f32, "W");
  auto xs = g.placeholder({T, B, H}, f32, "xs");
  auto pred = g.placeholder({}, boolean, "pred");
  auto bias = g.placeholder({H}, f32, "bias");
  auto h = for_loop(n, {h0}, [&](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{tanh(matmul(v[1], W) + gather(xs, v[0], 0))};
  })[0];
  auto out = cond(
      pred, {h}, [&](const std::vector<Tensor>& c) { return std::vector<Tensor>{c[0] + bias}; },
      [&](const std::vector<Tensor>& c) { return std::vector<Tensor>{matmul(c[0], W)}; })[0];
  auto exe = g.compile(kGpu, {}, {out});
  int run = 0;
  for (int64_t steps : {int64_t{T}, int64_t{4}, int64_t{T}, int64_t{0}}) {
    const bool taken = run++ % 2 == 0;
    Array hv = random_array({B, H}, f32), wv = random_array({H, H}, f32, -0.3, 0.3),
          xv = random_array({T, B, H}, f32), bv = random_array({H}, f32);
    const auto wd = to_f64(wv), xd = to_f64(xv), bd = to_f64(bv);
    const std::vector<double> hd = tanh_recurrence(to_f64(hv), wd, xd, B, H, steps);
    std::vector<double> want(B * H);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < H; ++j) {
        double s = taken ? hd[b * H + j] + bd[j] : 0;
        if (!taken)
          for (int64_t k = 0; k < H; ++k) s += hd[b * H + k] * wd[k * H + j];
        want[b * H + j] = s;
      }
    Array got = exe.run({{n, Array::scalar(steps)},
                         {h0, hv},
                         {W, wv},
                         {xs, xv},
                         {pred, Array::scalar(taken)},
                         {bias, bv}})[0];
    // (TF32 may round the products)
    expect_close(got.to(Device::cpu()), {B, H}, want, 5e-3, 5e-3);
  }
  expect_recorded(exe, 3);
}

// A for_loop whose body reads its loop index, recorded as launches of several steps each
// (KILN_LOOP_UNROLL: the default, set by the body's kernels, then 8 and 3) plus single steps for
// the rest of the trip count: trip counts below, at and across whole launches, every run replayed
// after the first.
TEST(CudaControlGraph, ForLoopStepsPerLaunch) {
  REQUIRE_CONDITIONAL_NODES();
  for (const char* unroll : {"", "8", "3"}) {
    const ScopedEnv steps("KILN_LOOP_UNROLL", unroll);
    Graph g;
    auto n = g.placeholder({}, i64, "n");
    auto x0 = g.placeholder({40}, f32, "x0");
    auto table = g.placeholder({32, 40}, f32, "table");
    auto out = for_loop(n, {x0}, [&](const std::vector<Tensor>& v) {
      auto row = reshape(gather(table, v[0], 0), {40});
      return std::vector<Tensor>{v[1] * 0.5 + row + cast(v[0], f32)};
    });
    auto exe = g.compile(kGpu, {}, out);
    int runs = 0;
    for (int64_t trips : {int64_t{9}, int64_t{0}, int64_t{1}, int64_t{8}, int64_t{3}, int64_t{17},
                          int64_t{32}, int64_t{7}}) {
      Array xv = random_array({40}, f32), tv = random_array({32, 40}, f32);
      std::vector<double> x = to_f64(xv);
      const std::vector<double> t = to_f64(tv);
      for (int64_t i = 0; i < trips; ++i)
        for (size_t k = 0; k < x.size(); ++k)
          x[k] = x[k] * 0.5 + t[static_cast<size_t>(i) * 40 + k] + static_cast<double>(i);
      auto r = exe.run({{n, Array::scalar(trips)}, {x0, xv}, {table, tv}});
      expect_close(r[0].to(Device::cpu()), {40}, x, 1e-5, 1e-5);
      ++runs;
    }
    expect_recorded(exe, runs - 1);
  }
}

// A while_loop recorded as launches of several steps (16 by default, then 8 and 3): the loop ends
// at every
// position inside a launch and in the next ones (the steps after its end run, their results are
// not taken), and max_trip_count holds exactly (18 iterations pass, a 19th fails) across a
// launch's steps.
TEST(CudaControlGraph, WhileLoopEndsInsideALaunch) {
  REQUIRE_CONDITIONAL_NODES();
  for (const char* unroll : {"", "8", "3"}) {
    const ScopedEnv steps("KILN_LOOP_UNROLL", unroll);
    Graph g;
    auto n = g.placeholder({}, i64, "n");
    auto x0 = g.placeholder({33}, f32, "x0");
    auto c = g.placeholder({33}, f32, "c");
    auto i0 = g.placeholder({}, i64, "i0");
    auto out = while_loop(
        {i0, x0}, [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{less(v[0], n)}; },
        [&](const std::vector<Tensor>& v) {
          return std::vector<Tensor>{v[0] + int64_t{1}, v[1] * 0.9 + c};
        },
        {.max_trip_count = 18});
    auto exe = g.compile(kGpu, {}, out);
    for (int64_t trips = 0; trips <= 20; ++trips) {
      Array xv = random_array({33}, f32), cv = random_array({33}, f32);
      std::vector<double> x = to_f64(xv);
      const std::vector<double> cs = to_f64(cv);
      const Feeds feeds{
          {n, Array::scalar(trips)}, {x0, xv}, {c, cv}, {i0, Array::scalar(int64_t{0})}};
      if (trips > 18) {
        expect_error<ValueError>([&] { exe.run(feeds); }, {"[while_loop]", "max_trip_count = 18"});
        continue;
      }
      for (int64_t t = 0; t < trips; ++t)
        for (size_t k = 0; k < x.size(); ++k) x[k] = x[k] * 0.9 + cs[k];
      auto r = exe.run(feeds);
      expect_equal(r[0].to(Device::cpu()), {}, {static_cast<double>(trips)});
      expect_close(r[1].to(Device::cpu()), {33}, x, 1e-5, 1e-5);
    }
    expect_recorded(exe, 8);
  }
}

// A while_loop whose step reads a table at its counter: a step past the loop's end would read
// out of range, so such a body runs one step per launch (steps past the end would report an
// error the loop never makes).
TEST(CudaControlGraph, BodiesThatCheckIndicesRunOneStepALaunch) {
  REQUIRE_CONDITIONAL_NODES();
  Graph g;
  auto table = g.placeholder({4, 6}, f32, "table");
  auto i0 = g.placeholder({}, i64, "i0");
  auto acc0 = g.placeholder({6}, f32, "acc0");
  auto out = while_loop(
      {i0, acc0}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(v[0], 4)}; },
      [&](const std::vector<Tensor>& v) {
        return std::vector<Tensor>{v[0] + int64_t{1}, v[1] + reshape(gather(table, v[0], 0), {6})};
      });
  auto exe = g.compile(kGpu, {}, out);
  for (int64_t start : {int64_t{0}, int64_t{2}, int64_t{4}, int64_t{1}}) {
    Array tv = random_array({4, 6}, f32), av = random_array({6}, f32);
    std::vector<double> acc = to_f64(av);
    const std::vector<double> t = to_f64(tv);
    for (int64_t i = start; i < 4; ++i)
      for (size_t k = 0; k < acc.size(); ++k) acc[k] += t[static_cast<size_t>(i) * 6 + k];
    auto r = exe.run({{table, tv}, {i0, Array::scalar(start)}, {acc0, av}});
    expect_equal(r[0].to(Device::cpu()), {}, {static_cast<double>(std::max<int64_t>(start, 4))});
    expect_close(r[1].to(Device::cpu()), {6}, acc, 1e-5, 1e-5);
  }
  expect_recorded(exe, 3);
}

// Errors found on the device inside a recorded loop fail the run like the host-driven loop's,
// and the executable runs on afterwards.
TEST(CudaControlGraph, ErrorsInsideRecordedLoops) {
  REQUIRE_CONDITIONAL_NODES();
  Graph g;
  auto i0 = g.placeholder({}, i64, "i0");
  auto out = while_loop(
      {i0}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(v[0], 100)}; },
      [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] + int64_t{1}}; },
      {.max_trip_count = 3});
  auto exe = g.compile(kGpu, {}, out);
  for (int rep = 0; rep < 2; ++rep) {
    expect_equal(exe.run({{i0, Array::scalar(int64_t{97})}})[0].to(Device::cpu()), {}, {100});
    expect_error<ValueError>(
        [&] {
          exe.run({{i0, Array::scalar(int64_t{90})}});
        },
        {"[while_loop]", "max_trip_count = 3"});
  }
  expect_equal(exe.run({{i0, Array::scalar(int64_t{99})}})[0].to(Device::cpu()), {}, {100});
  expect_recorded(exe, 2);

  // a gather inside a for_loop's body at an index the feed puts out of range on iteration 2
  Graph h;
  auto n = h.placeholder({}, i64, "n");
  auto table = h.placeholder({4, 3}, f32, "table");
  auto idx = h.placeholder({5}, i64, "idx");
  auto acc0 = h.placeholder({3}, f32, "acc0");
  auto sums = for_loop(n, {acc0}, [&](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{v[1] + reshape(gather(table, gather(idx, v[0], 0), 0), {3})};
  });
  auto exe2 = h.compile(kGpu, {}, sums);
  Array tv = random_array({4, 3}, f32), av = random_array({3}, f32);
  Array good = Array::from_vector<int64_t>({0, 3, 1, 2, 0}, {5});
  Array bad = Array::from_vector<int64_t>({0, 3, 9, 2, 0}, {5});
  const auto td = to_f64(tv);
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<double> want = to_f64(av);
    for (int64_t r : {0, 3, 1, 2, 0})
      for (int64_t k = 0; k < 3; ++k) want[k] += td[r * 3 + k];
    Array got = exe2.run({{n, Array::scalar(int64_t{5})}, {table, tv}, {idx, good}, {acc0, av}})[0];
    expect_close(got.to(Device::cpu()), {3}, want, 1e-6, 1e-6);
    expect_error<ValueError>(
        [&] {
          exe2.run({{n, Array::scalar(int64_t{5})}, {table, tv}, {idx, bad}, {acc0, av}});
        },
        {"[gather]", "index 9 out of range"});
  }
  expect_recorded(exe2, 2);
}

}  // namespace
}  // namespace kiln
