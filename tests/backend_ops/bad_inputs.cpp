// Bad and unusual inputs on every backend: an input that the CPU rejects when the graph runs (an
// index, label or length out of range), the target rejects too, with the same error class and
// the same "[op]" prefix, on its first run and on the replay of that run's recording; afterwards
// the same executable runs a repaired feed and matches the CPU. Inputs that are legal but unusual
// (empty tensors, NaN and infinities, integer division by zero) give the same outcome on every
// backend: the same output, or the same error class.
//
// Each case prints one line "bad_inputs: <case>: <outcome>", so the log shows what every backend
// did with every case.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace kiln::harness {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Expect {
  error,  // both backends throw the same error class
  same,   // the same output, or the same error class
};

struct BadCase {
  const char* name;
  Expect expect;
  /// Fills the graph, feeds and outputs. For Expect::error, `bad` is the index of the feed that
  /// holds the bad value: an all-zeros array of its shape and dtype is a legal feed.
  std::function<void(Case&, size_t& bad)> build;
};

// ---- outcomes ----

struct Outcome {
  std::string error_class;  // "" when the run returned
  std::string message;
  std::vector<Array> outputs;
};

std::string class_of(const std::exception& e) {
  if (dynamic_cast<const ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const UnsupportedError*>(&e)) return "UnsupportedError";
  if (dynamic_cast<const OutOfMemory*>(&e)) return "OutOfMemory";
  if (dynamic_cast<const DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

// "[op]" of a kiln message.
std::string prefix(const std::string& m) {
  const size_t end = m.find(']');
  return m.rfind('[', 0) == 0 && end != std::string::npos ? m.substr(0, end + 1) : m;
}

Outcome run(Executable& exe, const Feeds& feeds) {
  Outcome o;
  try {
    for (const Array& a : exe.run(feeds)) o.outputs.push_back(a.to(Device::cpu()).copy());
  } catch (const std::exception& e) {
    o.error_class = class_of(e);
    o.message = e.what();
  }
  return o;
}

std::string show(const Outcome& o) {
  return o.error_class.empty() ? fmt::format("{} outputs", o.outputs.size())
                               : fmt::format("{}: {}", o.error_class, o.message);
}

// "" when the target's outcome `got` is the CPU's `want`.
std::string same(const Outcome& want, const Outcome& got) {
  if (want.error_class != got.error_class || prefix(want.message) != prefix(got.message))
    return fmt::format("CPU: {}; target: {}", show(want), show(got));
  if (!want.error_class.empty()) return "";
  if (want.outputs.size() != got.outputs.size()) return "output counts differ";
  for (size_t k = 0; k < want.outputs.size(); ++k) {
    const DType t = want.outputs[k].dtype();
    const std::string m =
        compare(want.outputs[k], got.outputs[k], is_floating(t) ? test::tolerance(t) : 0);
    if (!m.empty()) return fmt::format("output {}: {}", k, m);
  }
  return "";
}

Feeds repaired(const Feeds& feeds, size_t bad) {
  Feeds r = feeds;
  const Array& a = feeds[bad].second;
  r[bad].second =
      from_f64(std::vector<double>(static_cast<size_t>(a.numel()), 0.0), a.shape(), a.dtype());
  return r;
}

void run_case(const BadCase& bc) {
  const std::string unavailable = target_unavailable();
  if (!unavailable.empty()) GTEST_SKIP() << unavailable;
  Case c;
  size_t bad = 0;
  try {
    bc.build(c, bad);
  } catch (const Error& e) {  // rejected while building: the same for every backend
    std::printf("bad_inputs: %s: rejected while building: %s\n", bc.name, e.what());
    EXPECT_EQ(bc.expect, Expect::same) << "a bad value must be rejected when the graph runs";
    return;
  }
  SCOPED_TRACE(std::string(bc.name) + " (" + c.label + ")");
  FeedShapes shapes;
  for (auto& [t, a] : c.feeds) shapes.emplace_back(t, a.shape());
  // no optimization: constant folding would evaluate the op under test on the CPU
  Executable cpu = c.g.compile(Device::cpu(), shapes, c.outs, {.optimize = false});
  Executable target =
      c.g.compile(target_device(), shapes, c.outs, {.optimize = false, .strict_placement = true});
  const Outcome want = run(cpu, c.feeds);
  std::printf("bad_inputs: %s: CPU %s\n", bc.name, show(want).c_str());
  if (bc.expect == Expect::error)
    EXPECT_EQ(want.error_class, "ValueError") << "the CPU accepted a bad input";
  // the target's first run, and the replay of its recording (GPU runs are recorded by default)
  for (int r = 0; r < 2; ++r) {
    const std::string m = same(want, run(target, c.feeds));
    EXPECT_EQ(m, "") << (r ? "replayed run" : "first run");
  }
  if (bc.expect != Expect::error) return;
  // the executable that rejected a feed runs the next one
  const Feeds good = repaired(c.feeds, bad);
  const Outcome want_good = run(cpu, good);
  EXPECT_EQ(want_good.error_class, "") << want_good.message;
  EXPECT_EQ(same(want_good, run(target, good)), "") << "the run after a rejected feed";
}

// ---- inputs ----

Tensor fed(Case& c, const std::vector<double>& v, const Shape& s, DType t) {
  return c.input(s, t, [v, t](const Shape& sh) { return from_f64(v, sh, t); });
}

// Index-like feeds: `v` with the bad value; the case's other inputs random.
BadCase index_case(const char* name, std::function<Tensor(Case&, Tensor)> op, std::vector<double> v,
                   Shape s, DType t = i64) {
  return {name, Expect::error, [=](Case& c, size_t& bad) {
            bad = c.feeds.size();
            Tensor idx = fed(c, v, s, t);
            c.outs = {op(c, idx)};
            c.note(fmt::format("indices {} {}", to_string(s), kiln::name(t)));
          }};
}

RnnLayerWeights rnn_weights(Case& c, int64_t gates, int64_t in, int64_t h) {
  return {c.rand({1, gates * h, in}, f32, -0.5, 0.5), c.rand({1, gates * h, h}, f32, -0.5, 0.5),
          c.rand({1, 2 * gates * h}, f32, -0.5, 0.5), std::nullopt};
}

// A layer over x (T = 5, B = 3, I = 4, H = 8) with seq_lens `lens`.
BadCase lens_case(const char* name, int cell, std::vector<double> lens, bool training = false) {
  return {name, Expect::error, [=](Case& c, size_t& bad) {
            Tensor x = c.rand({5, 3, 4}, f32, -1, 1);
            const int64_t gates = cell == 0 ? 4 : cell == 1 ? 3 : 1;
            std::vector<RnnLayerWeights> w{rnn_weights(c, gates, 4, 8)};
            bad = c.feeds.size();
            Tensor l = fed(c, lens, {3}, i32);
            RnnOptions o;
            o.training = training;
            RnnResult r = cell == 0   ? lstm(x, w, std::nullopt, std::nullopt, l, o)
                          : cell == 1 ? gru(x, w, std::nullopt, l, o)
                                      : rnn(x, w, std::nullopt, l, o);
            c.outs = {r.y, r.h};
            if (training) c.outs = gradients(sum(r.y), {x});
            c.note(fmt::format("cell {} seq_lens {} training {}", cell, fmt::join(lens, " "),
                               training));
          }};
}

// An op over fixed float data `v` of shape s (NaN, infinities).
BadCase values_case(const char* name, std::function<Tensor(Tensor)> op, std::vector<double> v,
                    Shape s, DType t = f32) {
  return {name, Expect::same, [=](Case& c, size_t&) {
            c.outs = {op(fed(c, v, s, t))};
            c.note(fmt::format("x {} {}", to_string(s), kiln::name(t)));
          }};
}

// An op over random inputs of the given shapes, some of them empty.
BadCase empty_case(const char* name, std::function<Tensor(std::vector<Tensor>)> op,
                   std::vector<Shape> shapes) {
  return {name, Expect::same, [=](Case& c, size_t&) {
            std::vector<Tensor> xs;
            for (const Shape& s : shapes) xs.push_back(c.rand(s, f32, -1, 1));
            c.outs = {op(xs)};
            for (const Shape& s : shapes) c.note("x " + to_string(s));
          }};
}

const std::vector<double> kSpecial = {kNaN, 1.5, -kInf, 0.0, kInf, -2.0,
                                      kNaN, 3.0, -0.0,  7.0, 1e30, -1e30};

std::vector<BadCase> cases() {
  using V = std::vector<double>;
  std::vector<BadCase> r = {
      // indices out of range
      index_case("gather_above",
                 [](Case& c, Tensor i) {
                   return gather(c.rand({5, 3}, f32), i, 0);
                 },
                 V{0, 4, 5, 1}, {4}),
      index_case(
          "gather_below_i32",
          [](Case& c, Tensor i) {
            return gather(c.rand({5, 3}, f32), i, 0);
          },
          V{-5, -6, 2}, {3}, i32),
      index_case("gather_axis1",
                 [](Case& c, Tensor i) {
                   return gather(c.rand({2, 3, 4}, f32), i, 1);
                 },
                 V{2, 1, 3, 0}, {2, 2}),
      index_case("gather_elements",
                 [](Case& c, Tensor i) {
                   return gather_elements(c.rand({4, 3}, f32), i, 1);
                 },
                 V{0, 1, 2, 2, 1, 0, 3, 0, 0, 1, 1, 1}, {4, 3}),
      index_case("scatter_elements",
                 [](Case& c, Tensor i) {
                   return scatter_elements(c.rand({4, 3}, f32), i, c.rand({2, 3}, f32), 0);
                 },
                 V{0, 1, 2, 3, 4, 1}, {2, 3}),
      index_case("scatter_elements_add",
                 [](Case& c, Tensor i) {
                   return scatter_elements(c.rand({4, 3}, f32), i, c.rand({2, 3}, f32), 0,
                                           ScatterReduction::add);
                 },
                 V{0, -5, 2, 3, 0, 1}, {2, 3}),
      index_case("gather_nd",
                 [](Case& c, Tensor i) {
                   return gather_nd(c.rand({4, 5}, f32), i);
                 },
                 V{0, 1, 3, 5, 2, 2}, {3, 2}),
      index_case("scatter_nd",
                 [](Case& c, Tensor i) {
                   return scatter_nd(c.rand({4, 5}, f32), i, c.rand({2, 5}, f32));
                 },
                 V{1, 4}, {2, 1}),
      index_case("embedding_above",
                 [](Case& c, Tensor i) {
                   return embedding(c.rand({6, 4}, f32), i);
                 },
                 V{0, 6, 2}, {3}),
      index_case(
          "embedding_negative",
          [](Case& c, Tensor i) {
            return embedding(c.rand({6, 4}, f32), i);
          },
          V{-1, 3}, {2}, i32),
      index_case("embedding_grad",
                 [](Case& c, Tensor i) {
                   return embedding_grad(i, c.rand({3, 4}, f32), 6);
                 },
                 V{5, 7, 0}, {3}),
      index_case("softmax_cross_entropy_label",
                 [](Case& c, Tensor i) {
                   return softmax_cross_entropy(c.rand({4, 5}, f32, -2, 2), i);
                 },
                 V{0, 5, 1, 2}, {4}),
      index_case(
          "softmax_cross_entropy_label_none",
          [](Case& c, Tensor i) {
            return softmax_cross_entropy(c.rand({4, 5}, f32, -2, 2), i, Reduction::none);
          },
          V{0, 1, -1, 2}, {4}, i32),
      index_case("nll_target",
                 [](Case& c, Tensor i) {
                   return nll(log_softmax(c.rand({4, 5}, f32, -2, 2), 1), i, Reduction::sum);
                 },
                 V{0, 7, 1, -100}, {4}),
      index_case("max_pool_grad_indices",
                 [](Case& c, Tensor i) {
                   return max_pool_grad(c.rand({1, 1, 2, 2}, f32), i, Shape{1, 1, 4, 4});
                 },
                 V{0, 3, 16, 10}, {1, 1, 2, 2}),
      // lengths out of range
      lens_case("lstm_seq_lens_above", 0, V{5, 6, 1}),
      lens_case("gru_seq_lens_negative", 1, V{2, -1, 5}),
      lens_case("rnn_seq_lens_above", 2, V{9, 0, 3}),
      lens_case("lstm_training_seq_lens_above", 0, V{1, 2, 8}, true),
      // legal indices with unusual values: the same output everywhere
      {"one_hot_out_of_range", Expect::same,
       [](Case& c, size_t&) {
         c.outs = {one_hot(fed(c, V{0, 3, -1, 4, 9, -9}, {6}, i64), 4)};
       }},
      // empty tensors
      empty_case("add_empty", [](auto x) { return x[0] + x[1]; }, {{0, 3}, {0, 3}}),
      empty_case("sum_over_empty", [](auto x) { return sum(x[0], {0}); }, {{0, 4}}),
      empty_case("mean_over_empty", [](auto x) { return mean(x[0], {1}); }, {{3, 0}}),
      empty_case("max_over_empty", [](auto x) { return max(x[0], {0}); }, {{0, 4}}),
      empty_case("argmax_over_empty", [](auto x) { return argmax(x[0], 0); }, {{0, 4}}),
      empty_case("matmul_k0", [](auto x) { return matmul(x[0], x[1]); }, {{2, 0}, {0, 3}}),
      empty_case("matmul_m0", [](auto x) { return matmul(x[0], x[1]); }, {{0, 4}, {4, 3}}),
      empty_case("softmax_empty", [](auto x) { return softmax(x[0], -1); }, {{0, 5}}),
      empty_case("concat_with_empty",
                 [](auto x) {
                   return concat({x[0], x[1]}, 0);
                 },
                 {{0, 3}, {2, 3}}),
      empty_case("cumsum_empty", [](auto x) { return cumsum(x[0], 1); }, {{2, 0}}),
      empty_case("sort_empty", [](auto x) { return sort(x[0], -1); }, {{3, 0}}),
      empty_case("layer_norm_empty_rows", [](auto x) { return layer_norm(x[0]); }, {{0, 8}}),
      {"gather_empty_indices", Expect::same,
       [](Case& c, size_t&) { c.outs = {gather(c.rand({5, 3}, f32), fed(c, V{}, {0}, i64), 0)}; }},
      // NaN and infinities
      values_case("relu_special", [](Tensor x) { return relu(x); }, kSpecial, {12}),
      values_case("exp_log_sqrt_special", [](Tensor x) { return exp(x) + log(x) + sqrt(x); },
                  kSpecial, {12}),
      values_case("max_reduce_nan", [](Tensor x) { return max(x, {1}); }, kSpecial, {3, 4}),
      values_case("sum_reduce_inf", [](Tensor x) { return sum(x, {0}); }, kSpecial, {3, 4}),
      values_case("argmax_nan", [](Tensor x) { return argmax(x, 1); }, kSpecial, {3, 4}),
      values_case("softmax_special", [](Tensor x) { return softmax(x, -1); }, kSpecial, {3, 4}),
      values_case("sort_nan", [](Tensor x) { return sort(x, -1); }, kSpecial, {2, 6}),
      values_case("clip_nan", [](Tensor x) { return clip(x, -1.0, 1.0); }, kSpecial, {12}),
      values_case("maximum_nan", [](Tensor x) { return maximum(x, flip(x, {0})); }, kSpecial, {12}),
      values_case("cumsum_inf", [](Tensor x) { return cumsum(x, 1); }, kSpecial, {2, 6}),
      values_case("layer_norm_inf", [](Tensor x) { return layer_norm(x); }, kSpecial, {3, 4}),
      values_case("matmul_inf_times_zero", [](Tensor x) { return matmul(x, transpose(x)); },
                  kSpecial, {3, 4}),
      values_case("max_pool_nan",
                  [](Tensor x) {
                    return max_pool(x, PoolOptions{.kernel = {2, 2}});
                  },
                  kSpecial, {1, 1, 3, 4}),
      values_case("div_by_zero_f32", [](Tensor x) { return div(x, x * 0.0); }, kSpecial, {12}),
      values_case(
          "div_by_zero_i32", [](Tensor x) { return div(x, x - x); }, V{7, -7, 0, 1}, {4}, i32),
      values_case(
          "mod_by_zero_i64", [](Tensor x) { return mod(x, x - x); }, V{7, -7, 0, 1}, {4}, i64),
      values_case("cast_special_to_i32", [](Tensor x) { return cast(x, i32); },
                  V{kNaN, kInf, -kInf, 1e30, -1e30, 2.5}, {6}),
  };
  return r;
}

class BadInputs : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInputs, SameOnEveryBackend) { run_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Case, BadInputs, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BadCase>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace kiln::harness
