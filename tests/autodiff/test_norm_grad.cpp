// Gradients of the norm family against finite differences: softmax, normalization layers, dropout.
#include <map>
#include <string>

#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

using Inputs = std::vector<Tensor>;

TEST(SoftmaxGrad, FiniteDifferences) {
  for (int64_t axis : {-1, 0, 1})
    check_gradients([&](const Inputs& x) { return softmax(x[0], axis); },
                    {random_array({2, 3, 4}, f64, -2, 2)});
  check_gradients([](const Inputs& x) { return softmax(x[0]); }, {random_array({5}, f64)});
  // a scalar is a row of one: softmax is 1 and its gradient 0
  check_gradients([](const Inputs& x) { return softmax(x[0]); }, {random_array({}, f64)});
}

TEST(LogSoftmaxGrad, FiniteDifferences) {
  for (int64_t axis : {-1, 0, 1})
    check_gradients([&](const Inputs& x) { return log_softmax(x[0], axis); },
                    {random_array({2, 3, 4}, f64, -2, 2)});
  check_gradients([](const Inputs& x) { return log_softmax(x[0]); }, {random_array({}, f64)});
}

TEST(LayerNormGrad, WeightAndBias) {
  const Shape shape{2, 3, 4};
  for (int64_t begin : {-1, 1, 0}) {
    const Shape params(shape.begin() + (begin < 0 ? begin + 3 : begin), shape.end());
    check_gradients(
        [&](const Inputs& x) { return layer_norm(x[0], x[1], x[2], begin); },
        {random_array(shape, f64), random_array(params, f64), random_array(params, f64)});
  }
}

TEST(LayerNormGrad, WeightOrBiasAbsent) {
  const Array x = random_array({3, 5}, f64), p = random_array({5}, f64);
  check_gradients([](const Inputs& x) { return layer_norm(x[0]); }, {x});
  check_gradients([](const Inputs& x) { return layer_norm(x[0], x[1]); }, {x, p});
  check_gradients([](const Inputs& x) { return layer_norm(x[0], std::nullopt, x[1]); }, {x, p});
  check_gradients([](const Inputs& x) { return layer_norm(x[0], std::nullopt, std::nullopt, 1); },
                  {random_array({2, 3, 2}, f64)});
}

TEST(RmsNormGrad, FiniteDifferences) {
  check_gradients([](const Inputs& x) { return rms_norm(x[0], x[1]); },
                  {random_array({3, 5}, f64), random_array({5}, f64)});
  check_gradients([](const Inputs& x) { return rms_norm(x[0], x[1], 1); },
                  {random_array({2, 3, 2}, f64), random_array({3, 2}, f64)});
  check_gradients([](const Inputs& x) { return rms_norm(x[0], std::nullopt, 0); },
                  {random_array({2, 3}, f64)});
}

// var drawn away from 0 so 1/sqrt(var + eps) stays moderate
TEST(BatchNormGrad, FiniteDifferences) {
  for (const Shape& shape : {Shape{2, 3, 4}, Shape{4, 3}, Shape{2, 3, 2, 2}}) {
    const Array x = random_array(shape, f64, -2, 2), m = random_array({3}, f64),
                v = random_array({3}, f64, 0.5, 1.5), w = random_array({3}, f64),
                b = random_array({3}, f64);
    check_gradients([](const Inputs& x) { return batch_norm(x[0], x[1], x[2], x[3], x[4]); },
                    {x, m, v, w, b});
    check_gradients([](const Inputs& x) { return batch_norm(x[0], x[1], x[2]); }, {x, m, v});
    check_gradients([](const Inputs& x) { return batch_norm(x[0], x[1], x[2], x[3]); },
                    {x, m, v, w});
    check_gradients(
        [](const Inputs& x) { return batch_norm(x[0], x[1], x[2], std::nullopt, x[3]); },
        {x, m, v, b});
  }
}

// The rule of batch_norm_train (the suite also names the op batch_norm_train_grad, which is not
// differentiable: its kernel is checked in tests/ops/test_norm.cpp).
TEST(BatchNormTrainGrad, OutputYThroughTheFusedBackward) {
  for (const Shape& shape :
       {Shape{4, 3}, Shape{2, 3, 4}, Shape{2, 3, 2, 2}, Shape{2, 2, 1, 2, 2}}) {
    const int64_t c = shape[1];
    const Array x = random_array(shape, f64, -2, 2), w = random_array({c}, f64, 0.5, 1.5),
                b = random_array({c}, f64);
    check_gradients([](const Inputs& x) { return batch_norm_train(x[0], x[1], x[2]).y; },
                    {x, w, b});
    check_gradients([](const Inputs& x) { return batch_norm_train(x[0]).y; }, {x});
    check_gradients([](const Inputs& x) { return batch_norm_train(x[0], x[1]).y; }, {x, w});
    check_gradients([](const Inputs& x) { return batch_norm_train(x[0], std::nullopt, x[1]).y; },
                    {x, b});
  }
}

TEST(BatchNormTrainGrad, LossesThatReadTheMeanAndVar) {
  for (const Shape& shape : {Shape{5, 3}, Shape{2, 3, 4}}) {
    const Array x = random_array(shape, f64, -2, 2), w = random_array({3}, f64, 0.5, 1.5),
                b = random_array({3}, f64);
    // every output weighted
    check_gradients(
        [](Graph&, const Inputs& x) {
          auto r = batch_norm_train(x[0], x[1], x[2]);
          return std::vector<Tensor>{r.y, r.mean, r.var};
        },
        {x, w, b});
    // the statistics alone (no gradient reaches y)
    check_gradients(
        [](Graph&, const Inputs& x) {
          auto r = batch_norm_train(x[0], x[1]);
          return std::vector<Tensor>{r.mean, r.var};
        },
        {x, w});
    check_gradients([](const Inputs& x) { return batch_norm_train(x[0]).mean; }, {x});
    check_gradients([](const Inputs& x) { return batch_norm_train(x[0]).var; }, {x});
  }
}

TEST(BatchNormTrainGrad, BatchNormTrainingAsBefore) {
  // batch_norm_training's y, built on batch_norm_train, with its running-stat updates unused
  const Shape shape{3, 2, 2, 3};
  check_gradients(
      [](Graph& g, const Inputs& x) {
        auto rm = g.variable(Array::zeros({2}, f64), "rm");
        auto rv = g.variable(random_array({2}, f64, 0.5, 1.5), "rv");
        return std::vector<Tensor>{batch_norm_training(x[0], rm, rv, x[1], x[2]).y};
      },
      {random_array(shape, f64, -2, 2), random_array({2}, f64), random_array({2}, f64)});
}

TEST(BatchNormTrainGrad, TrainingStepRunsOneFusedNodeEachWay) {
  Graph g;
  auto x = g.placeholder({4, 3, 5}, f32, "x");
  auto w = g.variable(random_array({3}, f32), "w"), b = g.variable(random_array({3}, f32), "b");
  auto rm = g.variable(random_array({3}, f32), "rm");
  auto rv = g.variable(random_array({3}, f32, 0.5, 1.5), "rv");
  auto bn = batch_norm_training(x, rm, rv, w, b);
  auto grads = gradients(sum(bn.y * bn.y), {x, w, b});
  auto exe = g.compile(Device::cpu(), {}, grads, bn.updates);
  std::map<std::string, int> count;
  for (const auto& step : exe.placement()) ++count[step.op];
  EXPECT_EQ(count["batch_norm_train"], 1) << exe.dump();
  EXPECT_EQ(count["batch_norm_train_grad"], 1) << exe.dump();
  EXPECT_EQ(count["mean"] + count["variance"] + count["rsqrt"], 0) << exe.dump();
}

TEST(InstanceNormGrad, FiniteDifferences) {
  for (const Shape& shape : {Shape{2, 3, 5}, Shape{1, 2, 3, 3}}) {
    const int64_t c = shape[1];
    const Array x = random_array(shape, f64), w = random_array({c}, f64),
                b = random_array({c}, f64);
    check_gradients([](const Inputs& x) { return instance_norm(x[0], x[1], x[2]); }, {x, w, b});
    check_gradients([](const Inputs& x) { return instance_norm(x[0]); }, {x});
    check_gradients([](const Inputs& x) { return instance_norm(x[0], x[1]); }, {x, w});
    check_gradients([](const Inputs& x) { return instance_norm(x[0], std::nullopt, x[1]); },
                    {x, b});
  }
}

TEST(GroupNormGrad, FiniteDifferences) {
  struct Case {
    Shape shape;
    int64_t groups;
  };
  for (auto [shape, groups] : {Case{{2, 4, 3}, 2}, Case{{1, 6, 2, 2}, 3}, Case{{2, 3, 4}, 1},
                               Case{{3, 4}, 2}, Case{{2, 3, 2}, 3}}) {
    const int64_t c = shape[1];
    const Array x = random_array(shape, f64), w = random_array({c}, f64),
                b = random_array({c}, f64);
    const int64_t g = groups;
    check_gradients([&](const Inputs& x) { return group_norm(x[0], g, x[1], x[2]); }, {x, w, b});
    check_gradients([&](const Inputs& x) { return group_norm(x[0], g); }, {x});
    check_gradients([&](const Inputs& x) { return group_norm(x[0], g, x[1]); }, {x, w});
    check_gradients([&](const Inputs& x) { return group_norm(x[0], g, std::nullopt, x[1]); },
                    {x, b});
  }
}

TEST(DropoutGrad, SameMaskAsForward) {
  for (double p : {0.3, 0.5, 0.9})
    check_gradients([&](const Inputs& x) { return dropout(x[0], p, true, 1234); },
                    {random_array({4, 6}, f64)});
}

TEST(DropoutGrad, GradientIsMaskOverKeep) {
  // dx = y / x elementwise: 0 where dropped, 1/(1-p) where kept
  Graph g;
  auto x = g.placeholder({64}, f64, "x");
  auto y = dropout(x, 0.25, true, 99);
  auto dx = gradients(y, {x})[0];
  Array vx = random_nonzero({64}, f64);
  auto out = eval(g, {y, dx}, {{x, vx}});
  std::vector<double> ref, vy = to_f64(out[0]), v = to_f64(vx);
  for (size_t i = 0; i < v.size(); ++i) ref.push_back(vy[i] / v[i]);
  expect_close(out[1], {64}, ref, 1e-12, 1e-12);
}

}  // namespace
}  // namespace kiln
