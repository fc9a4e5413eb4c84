// Variables updated in place on CUDA (src/passes/memory_plan.cpp): a training step whose
// optimizer updates and batch-norm statistics are made in the variables' storage gives the bits
// of the plan that copies every update through its assign, over several steps (the later ones
// replayed as a CUDA graph), and the same as the CPU within f32 rounding.
#include <fmt/format.h>

#include "kiln/kiln.h"
#include "kiln/optim.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(CudaInPlaceUpdates, TrainingStepsMatchTheCopyingPlan) {
  REQUIRE_GPU();
  const Array xs = random_array({8, 3, 6, 6}, f32);
  const Array w0 = random_array({4, 3, 3, 3}, f32, -0.5, 0.5);
  const Array wl0 = random_array({2, 4 * 4 * 4}, f32, -0.3, 0.3);
  const Array ys = random_array({8, 2}, f32);
  std::vector<std::vector<double>> got;
  for (const auto& [device, in_place] :
       {std::pair{Device::cuda(0), true}, {Device::cuda(0), false}, {Device::cpu(), true}}) {
    Graph g;
    auto x = g.placeholder({8, 3, 6, 6}, f32, "x");
    auto y = g.placeholder({8, 2}, f32, "y");
    auto w = g.variable(w0, "w");
    auto gamma = g.variable(Array::from_vector(std::vector<float>(4, 1.0f), {4}), "gamma");
    auto beta = g.variable(Array::zeros({4}, f32), "beta");
    auto rm = g.variable(Array::zeros({4}, f32), "running_mean");
    auto rv = g.variable(Array::from_vector(std::vector<float>(4, 1.0f), {4}), "running_var");
    auto wl = g.variable(wl0, "wl");
    auto bn = batch_norm_training(conv2d(x, w), rm, rv, gamma, beta);
    auto h = reshape(relu(bn.y), {8, 4 * 4 * 4});
    auto d = linear(h, wl) - y;
    auto loss = sum(d * d);
    const std::vector<Tensor> params{w, gamma, beta, wl};
    auto step = optim::sgd(g, params, gradients(loss, params), {.lr = 0.01, .momentum = 0.9});
    step.insert(step.end(), bn.updates.begin(), bn.updates.end());
    Executable e = g.compile(device, {}, {loss}, step, {.in_place = in_place});
    for (int i = 0; i < 4; ++i) e.run({{x, xs}, {y, ys}});
    std::vector<double> vals;
    for (const Tensor& v : std::vector<Tensor>{w, gamma, beta, wl, rm, rv}) {
      const auto a = to_f64(g.read_variable(v).to(Device::cpu()));
      vals.insert(vals.end(), a.begin(), a.end());
    }
    got.push_back(std::move(vals));
  }
  EXPECT_EQ(got[0], got[1]) << "in-place and copying plans differ on CUDA";
  ASSERT_EQ(got[0].size(), got[2].size());
  for (size_t i = 0; i < got[0].size(); ++i)
    EXPECT_NEAR(got[0][i], got[2][i], 1e-3 + 1e-3 * std::abs(got[2][i])) << "value " << i;
}

}  // namespace
}  // namespace kiln
