// Mixed precision: the autocast pass (casts only around matrix products and convolutions; results
// against float64 references on inputs rounded to the low precision), bf16 training of a convnet
// on the digits against f32 training, and f16 training with dynamic loss scaling that skips the
// steps whose gradients overflow.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "passes/program.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using detail::Node;
using detail::ValueRef;

bool low_op(OpId op) {
  return op == OpId::Matmul || op == OpId::Linear || op == OpId::Conv ||
         op == OpId::ConvTranspose || op == OpId::ConvGradWeight;
}

// Unit roundoff of a low precision: half the distance from 1 to the next value.
double roundoff(DType low) { return low == bf16 ? 0x1p-8 : 0x1p-11; }

// The values of `a` rounded to `low`, as doubles.
std::vector<double> rounded(const Array& a, DType low) { return to_f64(a.astype(low)); }

// The listed ops read and write `low` and nothing else does: casts convert between f32 and `low`,
// each value at most once per dtype; constants may be folded casts; variables stay f32. Reshapes
// and transposes may move `low` values (hoist_casts moves a cast before them), keeping the dtype.
void expect_casts_only_around_low_ops(const Program& p, DType low) {
  std::set<std::pair<ValueRef, DType>> casts;
  std::map<OpId, int> low_nodes;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const Node& n = p.graph.nodes[i];
    const std::string at = fmt::format("node %{} ({})", i, op_name(n.op));
    if (low_op(n.op)) {
      ++low_nodes[n.op];
      for (auto v : n.inputs) EXPECT_EQ(p.graph.info(v).dtype, low) << at;
      EXPECT_EQ(n.outputs[0].dtype, low) << at;
    } else if (n.op == OpId::Cast) {
      const DType from = p.graph.info(n.inputs[0]).dtype, to = n.outputs[0].dtype;
      EXPECT_TRUE((from == f32 && to == low) || (from == low && to == f32)) << at;
      EXPECT_TRUE(casts.insert({n.inputs[0], to}).second) << at << " casts a value again";
    } else if (n.op == OpId::Reshape || n.op == OpId::Transpose) {
      EXPECT_EQ(p.graph.info(n.inputs[0]).dtype, n.outputs[0].dtype) << at;
    } else if (n.op != OpId::Constant) {
      for (auto v : n.inputs) EXPECT_NE(p.graph.info(v).dtype, low) << at;
      for (auto& o : n.outputs) EXPECT_NE(o.dtype, low) << at;
    }
  }
  for (OpId op :
       {OpId::Matmul, OpId::Linear, OpId::Conv, OpId::ConvTranspose, OpId::ConvGradWeight})
    EXPECT_GT(low_nodes[op], 0) << op_name(op) << " missing from the test graph";
}

// Autocast runs before constant folding: the constant weight is stored in `low`, not cast per run.
void expect_constant_casts_folded(const Program& p, DType low) {
  int low_constants = 0;
  for (const Node& n : p.graph.nodes) {
    low_constants += n.op == OpId::Constant && n.outputs[0].dtype == low;
    if (n.op == OpId::Cast)
      EXPECT_NE(p.graph.nodes[n.inputs[0].node].op, OpId::Constant) << "a cast of a constant";
  }
  EXPECT_GT(low_constants, 0);
}

// A training step touching every listed op: conv, conv_transpose, linear with a constant weight
// (its cast folds), matmul, and their gradients (conv_grad_weight among them).
struct CastGraph {
  Graph g;
  Tensor x, loss;
  std::vector<Tensor> step;
  CastGraph() {
    x = g.placeholder({2, 1, 6, 6}, f32, "x");
    auto w = g.variable(random_array({3, 1, 3, 3}, f32), "w");
    auto b = g.variable(random_array({3}, f32), "b");
    auto wt = g.variable(random_array({3, 2, 2, 2}, f32), "wt");
    auto wl = g.constant(random_array({5, 2 * 7 * 7}, f32));
    auto wm = g.variable(random_array({5, 4}, f32), "wm");
    ConvOptions same;
    same.padding = {1, 1};
    Tensor h = relu(conv2d(x, w, b, same));      // (2, 3, 6, 6)
    h = conv_transpose2d(h, wt);                 // (2, 2, 7, 7)
    h = linear(reshape(h, {2, 2 * 7 * 7}), wl);  // (2, 5)
    loss = mean(softmax(matmul(tanh(h), wm)));   // (2, 4) -> ()
    std::vector<Tensor> vars{w, b, wt, wm};
    step = optim::sgd(g, vars, gradients(loss, vars), {.lr = 0.1});
  }
};

TEST(Autocast, CastsOnlyAroundMatmulsAndConvolutions) {
  for (DType low : {bf16, f16}) {
    CastGraph c;
    for (bool optimize : {false, true}) {
      SCOPED_TRACE(fmt::format("{}, optimize={}", name(low), optimize));
      // unfused: fused nodes would read the casts' values (the program checked is autocast's)
      auto exe = c.g.compile(Device::cpu(), {}, {c.loss}, c.step,
                             {.optimize = optimize, .autocast = low, .fuse_elementwise = false});
      expect_casts_only_around_low_ops(exe.impl().program, low);
      if (optimize) expect_constant_casts_folded(exe.impl().program, low);
      exe.run({{c.x, random_array({2, 1, 6, 6}, f32)}});
    }
    // the pass alone keeps shapes and references valid
    std::vector<ValueRef> outs{{c.loss.node_id(), 0}};
    for (const Tensor& u : c.step) outs.push_back({u.node_id(), 0});
    Program p = extract_program(c.g.impl(), outs);
    specialize_shapes(p, {});
    Program cast = autocast(p, low);
    verify_program(cast, "autocast");
    expect_casts_only_around_low_ops(cast, low);
  }
}

TEST(Autocast, LeavesOtherDtypesAndOpsAlone) {
  Graph g;
  auto a = g.placeholder({3, 4}, f64, "a");
  auto b = g.placeholder({4, 2}, f64, "b");
  auto y = softmax(matmul(a, b) * 2.0);
  Program p = extract_program(g.impl(), {{y.node_id(), 0}});
  specialize_shapes(p, {});
  EXPECT_EQ(autocast(p, bf16).graph.nodes.size(), p.graph.nodes.size());
}

TEST(Autocast, RejectsOtherDtypes) {
  Graph g;
  auto x = g.placeholder({2, 2}, f32, "x");
  for (DType t : {f32, f64, i32})
    expect_error<ValueError>([&] { g.compile(Device::cpu(), {}, {matmul(x, x)}, {.autocast = t}); },
                             {"[compile]", "autocast", name(t)});
}

// An outer product of low-precision values is exact in f32, so the result is the float64 product
// of the rounded inputs, rounded once more: equal to the last bit.
TEST(Autocast, OuterProductIsTheRoundedProductOfRoundedInputs) {
  for (DType low : {bf16, f16}) {
    SCOPED_TRACE(name(low));
    Graph g;
    Array av = random_array({5, 1}, f32), bv = random_array({1, 7}, f32);
    auto a = g.placeholder({5, 1}, f32, "a"), b = g.placeholder({1, 7}, f32, "b");
    const Feeds feeds{{a, av}, {b, bv}};
    Array got = eval(g, {matmul(a, b)}, feeds, {.autocast = low})[0];
    Array full = eval(g, {matmul(a, b)}, feeds)[0];
    const auto ra = rounded(av, low), rb = rounded(bv, low);
    std::vector<double> want(35);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 7; ++j) want[i * 7 + j] = ra[i] * rb[j];
    want = rounded(Array::from_vector(want, {5, 7}).astype(f32), low);
    expect_close(got, {5, 7}, want, 0, 0);
    EXPECT_NE(to_f64(got), to_f64(full)) << "autocast left the inputs unrounded";
  }
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Compares `out` run with autocast `low` against `ref` (float64 on the rounded inputs): within the
// rounding of the output, and away from the f32 result by about the rounding of the inputs.
void expect_low_precision(const Graph& g, const Tensor& out, const Feeds& feeds, DType low,
                          const std::vector<double>& ref) {
  Array got = eval(g, {out}, feeds, {.autocast = low})[0];
  const auto full = to_f64(eval(g, {out}, feeds)[0]);
  const double u = roundoff(low), scale = max_abs(ref);
  expect_close(got, out.shape(), ref, u * 1.01, 1e-5 * scale);
  std::vector<double> diff(full.size());
  for (size_t i = 0; i < full.size(); ++i) diff[i] = to_f64(got)[i] - full[i];
  EXPECT_GT(max_abs(diff), u / 4 * scale) << "inputs were not rounded";
  EXPECT_LT(max_abs(diff), 16 * u * scale) << "more error than rounding explains";
}

TEST(Autocast, MatmulLinearConvMatchFloat64OnRoundedInputs) {
  for (DType low : {bf16, f16}) {
    SCOPED_TRACE(name(low));
    {  // batched matmul (2, 9, 33) x (33, 5)
      Graph g;
      Array av = random_array({2, 9, 33}, f32), bv = random_array({33, 5}, f32);
      auto a = g.placeholder({2, 9, 33}, f32, "a"), b = g.placeholder({33, 5}, f32, "b");
      const auto ra = rounded(av, low), rb = rounded(bv, low);
      std::vector<double> ref(2 * 9 * 5, 0.0);
      for (int m = 0; m < 18; ++m)
        for (int n = 0; n < 5; ++n)
          for (int k = 0; k < 33; ++k) ref[m * 5 + n] += ra[m * 33 + k] * rb[k * 5 + n];
      expect_low_precision(g, matmul(a, b), {{a, av}, {b, bv}}, low, ref);
    }
    {  // linear with bias: x (6, 20), w (7, 20), b (7)
      Graph g;
      Array xv = random_array({6, 20}, f32), wv = random_array({7, 20}, f32),
            bv = random_array({7}, f32);
      auto x = g.placeholder({6, 20}, f32, "x");
      auto w = g.variable(wv, "w"), b = g.variable(bv, "b");
      const auto rx = rounded(xv, low), rw = rounded(wv, low), rbias = rounded(bv, low);
      std::vector<double> ref(6 * 7);
      for (int m = 0; m < 6; ++m)
        for (int n = 0; n < 7; ++n) {
          double acc = rbias[n];
          for (int k = 0; k < 20; ++k) acc += rx[m * 20 + k] * rw[n * 20 + k];
          ref[m * 7 + n] = acc;
        }
      expect_low_precision(g, linear(x, w, b), {{x, xv}}, low, ref);
    }
    {  // conv2d, padding 1: x (2, 3, 5, 5), w (4, 3, 3, 3)
      Graph g;
      Array xv = random_array({2, 3, 5, 5}, f32), wv = random_array({4, 3, 3, 3}, f32);
      auto x = g.placeholder({2, 3, 5, 5}, f32, "x");
      auto w = g.constant(wv);
      const auto rx = rounded(xv, low), rw = rounded(wv, low);
      std::vector<double> ref(2 * 4 * 5 * 5, 0.0);
      for (int n = 0; n < 2; ++n)
        for (int o = 0; o < 4; ++o)
          for (int i = 0; i < 5; ++i)
            for (int j = 0; j < 5; ++j)
              for (int c = 0; c < 3; ++c)
                for (int di = 0; di < 3; ++di)
                  for (int dj = 0; dj < 3; ++dj) {
                    const int yi = i + di - 1, xj = j + dj - 1;
                    if (yi < 0 || yi >= 5 || xj < 0 || xj >= 5) continue;
                    ref[((n * 4 + o) * 5 + i) * 5 + j] +=
                        rx[((n * 3 + c) * 5 + yi) * 5 + xj] * rw[((o * 3 + c) * 3 + di) * 3 + dj];
                  }
      ConvOptions same;
      same.padding = {1, 1};
      expect_low_precision(g, conv2d(x, w, std::nullopt, same), {{x, xv}}, low, ref);
    }
  }
}

// ---- bf16 training on the digits ----

struct Digits {
  Array train_x, train_y, test_x, test_y;
};

// The demo's split: a fixed shuffle, 80% train and 20% test.
Digits split(const Array& images, const Array& labels) {
  const int64_t n = images.shape()[0];
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<int64_t> test(order.begin(), order.begin() + n / 5),
      train(order.begin() + n / 5, order.end());
  return {images.take_rows(train), labels.take_rows(train), images.take_rows(test),
          labels.take_rows(test)};
}

// Trains a small convnet (fixed seeds) for `epochs` and returns the test accuracy in percent.
double train_digits(const Digits& d, std::optional<DType> autocast, int epochs) {
  constexpr int64_t kBatch = 32;
  Graph g;
  std::mt19937 init(2026);
  auto he = [&](const Shape& s, double fan_in) {
    std::normal_distribution<float> dist(0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
    std::vector<float> v(static_cast<size_t>(numel(s)));
    for (float& x : v) x = dist(init);
    return Array::from_vector(v, s);
  };
  auto w1 = g.variable(he({8, 1, 3, 3}, 9), "w1"), b1 = g.variable(Array::zeros({8}, f32), "b1");
  auto wf = g.variable(he({10, 128}, 128), "wf"), bf = g.variable(Array::zeros({10}, f32), "bf");
  const std::vector<Tensor> params{w1, b1, wf, bf};
  auto logits = [&](const Tensor& x) {
    ConvOptions same;
    same.padding = {1, 1};
    PoolOptions pool2;
    pool2.kernel = {2, 2};
    Tensor h = max_pool(relu(conv2d(x, w1, b1, same)), pool2);  // (N, 8, 4, 4)
    return linear(reshape(h, {-1, 128}), wf, bf);
  };
  auto x = g.placeholder({kBatch, 1, 8, 8}, f32, "x");
  auto y = g.placeholder({kBatch}, i64, "y");
  auto loss = softmax_cross_entropy(logits(x), y);
  auto step = optim::sgd(g, params, gradients(loss, params), {.lr = 0.05, .momentum = 0.9});
  const CompileOptions opts{.autocast = autocast};
  auto train = g.compile(Device::cpu(), {}, {loss}, step, opts);
  const int64_t n_test = d.test_x.shape()[0];
  auto xe = g.placeholder({n_test, 1, 8, 8}, f32, "test_x");
  auto eval = g.compile(Device::cpu(), {}, {argmax(logits(xe), -1)}, opts);

  std::vector<int64_t> idx(static_cast<size_t>(d.train_x.shape()[0]));
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937 shuffle(11);
  for (int e = 0; e < epochs; ++e) {
    std::shuffle(idx.begin(), idx.end(), shuffle);
    for (size_t s = 0; s + kBatch <= idx.size(); s += kBatch) {
      std::vector<int64_t> rows(idx.begin() + s, idx.begin() + s + kBatch);
      train.run({{x, d.train_x.take_rows(rows)}, {y, d.train_y.take_rows(rows)}});
    }
  }
  const auto pred = eval.run({{xe, d.test_x}})[0].to_vector<int64_t>();
  const auto want = d.test_y.to_vector<int64_t>();
  int64_t ok = 0;
  for (size_t i = 0; i < pred.size(); ++i) ok += pred[i] == want[i];
  return 100.0 * static_cast<double>(ok) / static_cast<double>(pred.size());
}

TEST(Autocast, Bf16TrainingOnDigitsMatchesF32) {
  const char* env = std::getenv("KILN_DIGITS_DIR");  // wins: suites run from a copied build
  const std::filesystem::path dir = env ? env : KILN_DIGITS_DIR;
  ASSERT_TRUE(std::filesystem::exists(dir / "digits_images.npy"))
      << "[autocast test] " << (dir / "digits_images.npy").string()
      << " is missing: write it with `.venv/bin/python scripts/digits.py " << dir.string()
      << "` (ctest runs that as the Data.Digits fixture)";
  const Digits d = split(Array::load_npy((dir / "digits_images.npy").string()),
                         Array::load_npy((dir / "digits_labels.npy").string()));
  const double f32_acc = train_digits(d, std::nullopt, 6);
  const double bf16_acc = train_digits(d, bf16, 6);
  EXPECT_GT(f32_acc, 95.0);
  EXPECT_NEAR(bf16_acc, f32_acc, 1.0);
}

// ---- f16 training with dynamic loss scaling ----

using MakeStep = optim::StepBuilder;

// A small tanh MLP fit to a random linear teacher with f16 autocast and loss scaling.
struct ScaledMlp {
  static constexpr int N = 16, I = 4, H = 8, O = 3;
  Graph g;
  Tensor x, t, loss;
  optim::LossScaled scaled;
  Executable exe;
  Array xv, tv;

  ScaledMlp(const MakeStep& step, const optim::LossScaleOptions& o) {
    x = g.placeholder({N, I}, f32, "x");
    t = g.placeholder({N, O}, f32, "t");
    auto w1 = g.variable(random_array({H, I}, f32), "w1");
    auto b1 = g.variable(random_array({H}, f32, -0.1, 0.1), "b1");
    auto w2 = g.variable(random_array({O, H}, f32), "w2");
    auto b2 = g.variable(random_array({O}, f32, -0.1, 0.1), "b2");
    loss = mse(linear(tanh(linear(x, w1, b1)), w2, b2), t);
    scaled = optim::scale_loss_and_step(g, loss, {w1, b1, w2, b2}, step, o);
    exe = g.compile(Device::cpu(), {}, {loss, scaled.finite}, scaled.updates, {.autocast = f16});
    xv = random_array({N, I}, f32);
    const auto teacher = to_f64(random_array({O, I}, f32));
    const auto xs = to_f64(xv);
    std::vector<double> tt(N * O, 0.0);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < O; ++o)
        for (int i = 0; i < I; ++i) tt[n * O + o] += 0.5 * teacher[o * I + i] * xs[n * I + i];
    tv = Array::from_vector(tt, {N, O}).astype(f32);
  }
  // One step on `input`: (loss, whether the step was applied).
  std::pair<double, bool> step(const Array& input) {
    auto out = exe.run({{x, input}, {t, tv}});
    return {to_f64(out[0])[0], to_f64(out[1])[0] != 0};
  }
  double scale() { return to_f64(g.read_variable(scaled.scale))[0]; }
  // Every variable but the scale's own: the model and the optimizer state.
  std::map<std::string, std::vector<double>> state() {
    std::map<std::string, std::vector<double>> s;
    for (const Tensor& v : g.variables())
      if (v.name().rfind("loss_scale", 0) != 0) s[v.name()] = to_f64(g.read_variable(v));
    return s;
  }
};

using Vars = std::vector<Tensor>;
Vars sgd_step(Graph& g, const Vars& v, const Vars& gr) {
  return optim::sgd(g, v, gr, {.lr = 0.1, .momentum = 0.9});
}
Vars adam_step(Graph& g, const Vars& v, const Vars& gr) {
  return optim::adam(g, v, gr, {.lr = 0.02});
}
Vars adamw_step(Graph& g, const Vars& v, const Vars& gr) {
  return optim::adamw(g, v, gr, {.lr = 0.02, .weight_decay = 0.01});
}
Vars rmsprop_step(Graph& g, const Vars& v, const Vars& gr) {
  return optim::rmsprop(g, v, gr, {.lr = 0.005, .momentum = 0.5});
}
const std::vector<std::pair<const char*, MakeStep>> kOptimizers{
    {"sgd", sgd_step}, {"adam", adam_step}, {"adamw", adamw_step}, {"rmsprop", rmsprop_step}};

// A scale of 2^40 overflows f16 in the backward pass: steps are skipped, the scale halves until
// the gradients fit, then training converges; an injected inf input is skipped the same way.
TEST(LossScale, F16SkipsOverflowingStepsAndConverges) {
  for (const auto& [opt, make] : kOptimizers) {
    SCOPED_TRACE(opt);
    ScaledMlp m(make, {.initial = 0x1p40});
    auto before = m.state();
    auto [loss0, applied] = m.step(m.xv);
    EXPECT_FALSE(applied);
    EXPECT_EQ(m.state(), before) << "an overflowing step changed the variables";
    EXPECT_EQ(m.scale(), 0x1p39);

    int skipped = 1;
    while (!m.step(m.xv).second) ASSERT_LT(++skipped, 40) << "the scale never fit f16";
    EXPECT_EQ(m.scale(), std::ldexp(1.0, 40 - skipped)) << "the scale halves on every skipped step";
    EXPECT_NE(m.state(), before);
    double loss = 0;
    for (int s = 0; s < 150; ++s) loss = m.step(m.xv).first;
    EXPECT_LT(loss, 0.1 * loss0) << "from " << loss0;

    // an input beyond f16's range makes the gradients inf/nan: skipped, and the scale backs off
    Array bad = m.xv.copy();
    bad.data<float>()[0] = 1e6f;
    before = m.state();
    const double scale = m.scale();
    EXPECT_FALSE(m.step(bad).second);
    EXPECT_EQ(m.state(), before);
    EXPECT_EQ(m.scale(), scale / 2);
    EXPECT_TRUE(m.step(m.xv).second);
    EXPECT_NE(m.state(), before);
  }
}

TEST(LossScale, GrowsAfterIntervalOfFiniteSteps) {
  ScaledMlp m(sgd_step, {.initial = 256, .growth_interval = 3});
  const std::vector<double> scales{256, 256, 512, 512, 512, 1024};
  const std::vector<double> counts{1, 2, 0, 1, 2, 0};
  for (size_t s = 0; s < scales.size(); ++s) {
    EXPECT_TRUE(m.step(m.xv).second) << "step " << s;
    EXPECT_EQ(m.scale(), scales[s]) << "step " << s;
    EXPECT_EQ(to_f64(m.g.read_variable(m.scaled.good_steps))[0], counts[s]) << "step " << s;
  }
}

TEST(LossScale, RejectsBadArguments) {
  Graph g;
  auto w = g.variable(random_array({3}, f32), "w");
  auto loss = sum(w * w);
  expect_error<ValueError>([&] { optim::scale_loss_and_step(g, w * w, {w}, sgd_step); },
                           {"[loss_scale]", "0-d", "(3,)"});
  expect_error<ValueError>(
      [&] { optim::scale_loss_and_step(g, loss, {w}, sgd_step, {.backoff = 2}); },
      {"[loss_scale]", "backoff"});
  auto ok = greater(sum(w), scalar_like(sum(w), 0));
  expect_error<ValueError>([&] { optim::apply_if(ok, {w * 2.0}); },
                           {"[apply_if]", "update 0", "mul", "not an assign"});
  expect_error<ValueError>([&] { optim::apply_if(w, {assign(w, w * 2.0)}); },
                           {"[apply_if]", "0-d bool", "f32"});
}

}  // namespace
}  // namespace kiln
