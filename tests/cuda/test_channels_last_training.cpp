// CUDA training on NHWC data (the channels_last pass on training programs): the NHWC kernels of
// conv_transpose, conv_grad_weight, batch_norm_train(_grad), max_pool(_grad) and
// adaptive_avg_pool(_grad) against the CPU's NCHW ops, in every dtype the pass can leave on NHWC
// values (the ops between NHWC convs take any; a conv_transpose without input channels, f64
// too), and a ResNet-shaped training step (bf16 and f16 autocast) compiled with the pass on and
// off (KILN_CHANNELS_LAST=0) and on the CPU: the NHWC step's losses, gradients and variables
// after SGD steps are no further from the CPU's f32 values than twice the NCHW step's on average
// (or a floor), none grossly off.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#include "core/graph_impl.h"
#include "kiln/kiln.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/nets.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const std::vector<int64_t> kToNhwc{0, 2, 3, 1}, kToNchw{0, 3, 1, 2};

// Expects max |got - want| <= tol * max |want| (and a non-trivial want).
void expect_near_scaled(const Array& got, const Array& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = to_f64(got.to(Device::cpu())), w = to_f64(want.to(Device::cpu()));
  double scale = 0, worst = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  EXPECT_GT(scale, 1e-6) << what;
  EXPECT_LE(worst, tol * scale) << what << ": largest difference " << worst << " of scale "
                                << scale;
}

std::vector<Array> eval_on(const Graph& g, Device device, const std::vector<Tensor>& outs,
                           const Feeds& feeds) {
  FeedShapes shapes;
  for (const auto& [t, a] : feeds) shapes.emplace_back(t, a.shape());
  std::vector<Array> r = g.compile(device, shapes, outs).run(feeds);
  for (Array& a : r) a = a.to(Device::cpu());
  return r;
}

// The node of `nchw` (one op) again with channels_last on `inputs` (already NHWC), its 4-D
// outputs permuted back to NCHW; f32 convolutions with tf32, as the pass gives them.
std::vector<Tensor> nhwc_twin(const Tensor& nchw, const std::vector<Tensor>& inputs) {
  const auto& node = nchw.graph_impl()->nodes[nchw.node_id()];
  Attrs attrs = node.attrs;
  const OpId op = node.op;
  attrs.set("channels_last", true);
  if ((op == OpId::ConvTranspose || op == OpId::ConvGradWeight) && nchw.dtype() == f32)
    attrs.set("tf32", true);
  std::vector<Tensor> out = detail::make_node(op, inputs, attrs);
  for (Tensor& t : out)
    if (t.rank() == 4) t = transpose(t, kToNchw);
  return out;
}

// The NCHW outputs computed on the CPU and the NHWC twins on CUDA (the pass off, so the NCHW
// nodes stay as written), compared output by output.
void check_twins(const Graph& g, const std::vector<Tensor>& nchw, const std::vector<Tensor>& nhwc,
                 const Feeds& feeds, double tol, const std::string& what) {
  ASSERT_EQ(nchw.size(), nhwc.size());
  const auto want = eval_on(g, Device::cpu(), nchw, feeds);
  std::optional<std::vector<Array>> got;
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", "0");
    got = eval_on(g, Device::cuda(0), nhwc, feeds);
  }
  for (size_t i = 0; i < want.size(); ++i)
    expect_near_scaled((*got)[i], want[i], tol, fmt::format("{} output {}", what, i));
}

TEST(CudaChannelsLastTraining, BatchNormMatchesCpu) {
  REQUIRE_GPU();
  // 7 channels: one access per channel for every dtype; 12: one for bf16 and f16, 16 bytes for
  // f32 and f64; 72: two tiles, the second partial; rows enough for several spans
  for (DType t : {f32, bf16, f16, f64})
    for (int64_t c : {7, 12, 64, 72}) {
      const std::string what = fmt::format("{} C={}", name(t), c);
      Graph g;
      const Shape s{4, c, 15, 13};
      const Tensor x = g.placeholder(s, t, "x"), dy = g.placeholder(s, t, "dy");
      const Tensor w = g.constant(random_array({c}, t, 0.5, 1.5));
      const Tensor b = g.constant(random_array({c}, t));
      const BatchNormTrainResult r = batch_norm_train(x, w, b, 1e-5);
      const BatchNormTrainGradResult d = batch_norm_train_grad(dy, x, r.mean, r.var, w, 1e-5);
      const Tensor xt = transpose(x, kToNhwc), dyt = transpose(dy, kToNhwc);
      const auto fwd = nhwc_twin(r.y, {xt, w, b});
      const auto bwd = nhwc_twin(d.dx, {dyt, xt, r.mean, r.var, w});
      // values off zero, so the shifted sums matter
      const Feeds feeds{{x, random_array(s, t, 2.0, 4.0)}, {dy, random_array(s, t)}};
      const double tol = t == f64 ? 1e-9 : t == f32 ? 1e-4 : 2e-2;
      check_twins(g, {r.y, r.mean, r.var, d.dx, d.dweight, d.dbias},
                  {fwd[0], fwd[1], fwd[2], bwd[0], bwd[1], bwd[2]}, feeds, tol, what);
    }
}

TEST(CudaChannelsLastTraining, PoolGradientsMatchCpu) {
  REQUIRE_GPU();
  // (7 channels: one per access for every dtype; 12 and 64: 16-byte accesses where they divide)
  for (DType t : {f32, bf16, f16, f64})
    for (int64_t c : {7, 12, 64}) {
      const std::string what = fmt::format("{} C={}", name(t), c);
      Graph g;
      const Shape s{2, c, 11, 9};
      const Tensor x = g.placeholder(s, t, "x");
      const auto [y, idx] =
          max_pool_with_indices(x, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
      const Tensor dy = g.placeholder(y.shape(), t, "dy");
      const Tensor dyt = transpose(dy, kToNhwc);
      // i64 indices as max pooling gives them, and i32 ones
      const Tensor idx32 = cast(idx, i32);
      const Tensor mp = max_pool_grad(dy, idx, s), mp32 = max_pool_grad(dy, idx32, s);
      const Tensor mp_t = nhwc_twin(mp, {dyt, transpose(idx, kToNhwc)})[0];
      const Tensor mp32_t = nhwc_twin(mp32, {dyt, transpose(idx32, kToNhwc)})[0];
      const Tensor ga = g.placeholder({2, c, 1, 1}, t, "ga");
      const Tensor gb = g.placeholder({2, c, 3, 2}, t, "gb");
      const Tensor aa = adaptive_avg_pool_grad(ga, s), ab = adaptive_avg_pool_grad(gb, s);
      const Tensor aa_t = nhwc_twin(aa, {transpose(ga, kToNhwc)})[0];
      const Tensor ab_t = nhwc_twin(ab, {transpose(gb, kToNhwc)})[0];
      const Feeds feeds{{x, random_array(s, t)},
                        {dy, random_array(y.shape(), t)},
                        {ga, random_array({2, c, 1, 1}, t)},
                        {gb, random_array({2, c, 3, 2}, t)}};
      const double tol = t == f64 ? 1e-12 : t == f32 ? 1e-5 : 1e-2;
      check_twins(g, {mp, mp32, aa, ab}, {mp_t, mp32_t, aa_t, ab_t}, feeds, tol, what);
    }
}

// The forward pools that CUDA runs on NHWC values between NHWC nodes (of any dtype the values
// have there, such as a cast's).
TEST(CudaChannelsLastTraining, PoolsMatchCpu) {
  REQUIRE_GPU();
  // max pooling, values and indices exact: 7 channels one per access, 16 in 16-byte accesses
  for (DType t : {f64, i32, i64, i16})
    for (int64_t c : {7, 16}) {
      Graph g;
      const Shape s{2, c, 11, 9};
      const Tensor x = g.placeholder(s, t, "x");
      const auto [y, idx] =
          max_pool_with_indices(x, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
      const auto twin = nhwc_twin(y, {transpose(x, kToNhwc)});
      const Array data = is_floating(t) ? random_array(s, t) : random_ints(s, -100, 100, t);
      check_twins(g, {y, idx}, {twin[0], twin[1]}, {{x, data}}, 0,
                  fmt::format("max_pool {} C={}", name(t), c));
    }
  // adaptive average pooling with outputs enough for a channel a thread (over 132 SMs * 1024
  // threads of 16 bytes), 7 channels: one per access
  for (DType t : {f32, bf16, f16, f64}) {
    Graph g;
    const Shape s{4, 7, 225, 225};
    const Tensor x = g.placeholder(s, t, "x");
    const Tensor y = adaptive_avg_pool(x, {224, 224});
    const Tensor y_t = nhwc_twin(y, {transpose(x, kToNhwc)})[0];
    const double tol = t == f64 ? 1e-12 : t == f32 ? 1e-5 : 1e-2;
    check_twins(g, {y}, {y_t}, {{x, random_array(s, t)}}, tol,
                fmt::format("adaptive_avg_pool {}", name(t)));
  }
}

TEST(CudaChannelsLastTraining, ConvGradientsMatchCpu) {
  REQUIRE_GPU();
  struct Case {
    Shape x, w;
    int64_t stride, pad, groups;
  };
  const Case cases[] = {{{2, 16, 9, 9}, {32, 16, 3, 3}, 2, 1, 1},
                        {{2, 24, 8, 8}, {16, 24, 1, 1}, 1, 0, 1},
                        {{2, 16, 7, 7}, {16, 4, 3, 3}, 1, 1, 4}};
  for (DType t : {f32, bf16})
    for (const Case& k : cases) {
      const std::string what =
          fmt::format("{} x {} w {} groups {}", name(t), to_string(k.x), to_string(k.w), k.groups);
      Graph g;
      const Tensor x = g.placeholder(k.x, t, "x"), w = g.placeholder(k.w, t, "w");
      ConvOptions o;
      o.stride = {k.stride, k.stride};
      o.padding = {k.pad, k.pad};
      o.groups = k.groups;
      const Shape ys = conv2d(x, w, std::nullopt, o).shape();
      const Tensor dy = g.placeholder(ys, t, "dy");
      const Tensor bias = g.constant(random_array({k.x[1]}, t));
      // the data gradient as autodiff writes it (a conv_transpose of dy with w), with a bias
      const Tensor dx = gradients(sum(conv2d(x, w, std::nullopt, o) * dy), {x})[0];
      ConvTransposeOptions to;
      to.stride = o.stride;
      to.padding = o.padding;
      to.groups = k.groups;
      to.output_padding = {k.x[2] - ((ys[2] - 1) * k.stride - 2 * k.pad + k.w[2]),
                           k.x[3] - ((ys[3] - 1) * k.stride - 2 * k.pad + k.w[3])};
      const Tensor dxb = conv_transpose2d(dy, w, bias, to);
      ASSERT_EQ(dx.graph_impl()->nodes[dx.node_id()].op, OpId::ConvTranspose);
      const Tensor dw = conv_grad_weight(x, dy, k.w, o);
      const Tensor xt = transpose(x, kToNhwc), wt = transpose(w, kToNhwc),
                   dyt = transpose(dy, kToNhwc);
      const Tensor dx_t = nhwc_twin(dx, {dyt, wt})[0];
      const Tensor dxb_t = nhwc_twin(dxb, {dyt, wt, bias})[0];
      const Tensor dw_t = nhwc_twin(dw, {xt, dyt})[0];
      const Feeds feeds{{x, random_array(k.x, t)}, {w, random_array(k.w, t)},
                        {dy, random_array(ys, t)}};
      // (f32: TF32 products against the CPU's f32)
      check_twins(g, {dx, dxb, dw}, {dx_t, dxb_t, dw_t}, feeds, t == f32 ? 5e-3 : 3e-2, what);
    }
}

// A conv_transpose without input channels is its bias: on NHWC it runs no cuDNN pass, only the
// bias epilogue, in any float dtype (f64 too, which cuDNN has no NHWC algorithms for); 3
// channels one per access, 8 in 16-byte accesses.
TEST(CudaChannelsLastTraining, ConvTransposeWithoutInputChannelsGivesTheBias) {
  REQUIRE_GPU();
  for (DType t : {f64, f32})
    for (int64_t c : {3, 8}) {
      Graph g;
      const Tensor x = g.placeholder({2, 0, 5, 5}, t, "x");
      const Tensor w = g.placeholder({0, c, 3, 3}, t, "w");
      const Tensor bias = g.constant(random_array({c}, t));
      ConvTransposeOptions o;
      o.padding = {1, 1};
      const Tensor y = conv_transpose2d(x, w, bias, o);
      const Tensor y_t = nhwc_twin(y, {transpose(x, kToNhwc), transpose(w, kToNhwc), bias})[0];
      check_twins(g, {y}, {y_t},
                  {{x, random_array({2, 0, 5, 5}, t)}, {w, random_array({0, c, 3, 3}, t)}}, 0,
                  fmt::format("{} C={}", name(t), c));
    }
}

// ---- a training step ----

struct Trained {
  std::vector<double> losses;
  std::vector<Array> grads;             // of the first step
  std::vector<std::vector<double>> moved;  // variables after the last step less their start
  int transposes = 0, convs = 0;
};

struct Batch {
  Array x, labels;
};

// SGD steps of train_net, from `start`'s parameter values, on `device`.
Trained train(const TrainNet& start, Device device, const CompileOptions& opts,
              bool channels_last, const std::vector<Batch>& batches) {
  Graph g;
  const TrainNet net = train_net(g, true);
  for (size_t i = 0; i < net.params.size(); ++i) g.write_variable(net.params[i], start.values[i]);
  const std::vector<Tensor> grads = gradients(net.loss, net.params);
  std::vector<Tensor> updates = optim::sgd(g, net.params, grads, {.lr = 0.1});
  updates.insert(updates.end(), net.bn_updates.begin(), net.bn_updates.end());
  std::vector<Tensor> targets{net.loss};
  targets.insert(targets.end(), grads.begin(), grads.end());
  std::vector<std::vector<double>> initial;
  for (const auto* list : {&net.params, &net.stats})
    for (const Tensor& v : *list) initial.push_back(to_f64(g.read_variable(v).to(Device::cpu())));
  std::optional<Executable> exe;
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", channels_last ? "1" : "0");
    exe = g.compile(device, {}, targets, updates, opts);
  }
  Trained r;
  r.transposes = count_steps(*exe, "transpose");
  r.convs = count_steps(*exe, "conv") + count_steps(*exe, "fused_conv");
  for (size_t step = 0; step < batches.size(); ++step) {
    auto out = exe->run({{net.x, batches[step].x}, {net.labels, batches[step].labels}});
    r.losses.push_back(to_f64(out[0].to(Device::cpu()))[0]);
    if (step == 0)
      for (size_t i = 1; i < out.size(); ++i) r.grads.push_back(out[i].to(Device::cpu()));
  }
  size_t k = 0;
  for (const auto* list : {&net.params, &net.stats})
    for (const Tensor& v : *list) {
      auto now = to_f64(g.read_variable(v).to(Device::cpu()));
      for (size_t j = 0; j < now.size(); ++j) now[j] -= initial[k][j];
      r.moved.push_back(std::move(now));
      ++k;
    }
  return r;
}

// max |got - want| / max |want|
double scaled_error(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double scale = 0, worst = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_GT(scale, 1e-7);
  return worst / std::max(scale, 1e-30);
}

// Every value of a step (the losses, the first step's gradients, the variables' changes) from
// NHWC on CUDA against the CPU in f32, next to the same value from NCHW on CUDA. Low precision
// rounds differently at every op (a max pool's pick or a ReLU's sign can flip) and three SGD
// steps carry it into the variables, so one value's error is noise whose size the NCHW step
// shows. The NHWC errors' mean may be at most twice the NCHW errors' mean (or 0.1), and no
// value's error above twice the NCHW step's largest (or 1: one value's error is heavy-tailed,
// so only a gross error fails this). A layout mistake (a channel read as a pixel) gives errors
// of the order of 1 in every value after it: the input misread gives a mean of 0.77-1.09. On
// the H200 (140 runs of f16 and bf16): the mean error 0.003-0.18, its ratio NHWC / NCHW
// 0.12-2.63 (both ways: noise; over 2 in 2 runs); the largest 0.03-0.66, once 0.39 against
// 0.16. Value by value, twice the same value's NCHW error failed in 3 f16 runs of 8.
void check_step(const CompileOptions& opts) {
  const double worst_floor = 1.0, mean_floor = 0.1;
  Graph g0;
  const TrainNet start = train_net(g0, true);
  std::vector<Batch> batches;
  for (int i = 0; i < 3; ++i)
    batches.push_back({random_array({4, 3, 16, 16}, f32), random_ints({4}, 0, 9)});
  const Trained on = train(start, Device::cuda(0), opts, true, batches);
  const Trained off = train(start, Device::cuda(0), opts, false, batches);
  const Trained cpu = train(start, Device::cpu(), {}, true, batches);
  // NHWC: the input, the 3x3 convs' weights and weight gradients are the only transposes added
  // (the 1x1 conv's become reshapes)
  EXPECT_EQ(on.convs, off.convs);
  EXPECT_GT(on.transposes, off.transposes);
  EXPECT_LE(on.transposes, off.transposes + 1 + 2 * 5);
  struct Error {
    std::string what;
    double on, off;
  };
  std::vector<Error> errors;
  auto compare = [&](const std::vector<double>& a, const std::vector<double>& b,
                     const std::vector<double>& want, const std::string& what) {
    errors.push_back({what, scaled_error(a, want), scaled_error(b, want)});
  };
  for (size_t st = 0; st < cpu.losses.size(); ++st)
    compare({on.losses[st]}, {off.losses[st]}, {cpu.losses[st]}, fmt::format("loss {}", st));
  ASSERT_EQ(on.grads.size(), cpu.grads.size());
  ASSERT_EQ(off.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    compare(to_f64(on.grads[i]), to_f64(off.grads[i]), to_f64(cpu.grads[i]),
            fmt::format("gradient {}", i));
  ASSERT_EQ(on.moved.size(), cpu.moved.size());
  ASSERT_EQ(off.moved.size(), cpu.moved.size());
  for (size_t i = 0; i < cpu.moved.size(); ++i)
    compare(on.moved[i], off.moved[i], cpu.moved[i], fmt::format("variable {}", i));
  double worst_on = 0, worst_off = 0, mean_on = 0, mean_off = 0;
  for (const Error& e : errors) {
    worst_on = std::max(worst_on, e.on);
    worst_off = std::max(worst_off, e.off);
    mean_on += e.on / errors.size();
    mean_off += e.off / errors.size();
  }
  std::string worst_what;
  for (const Error& e : errors)
    if (e.on == worst_on) worst_what = e.what;
  EXPECT_LE(worst_on, std::max(worst_floor, 2 * worst_off))
      << "largest error against the CPU: NHWC " << worst_on << " (" << worst_what << "), NCHW "
      << worst_off;
  EXPECT_LE(mean_on, std::max(mean_floor, 2 * mean_off))
      << "mean error against the CPU over " << errors.size() << " values: NHWC " << mean_on
      << ", NCHW " << mean_off;
  // The checks can fail: the step on the CPU with its input read in the wrong layout (each
  // image's NHWC bytes taken as NCHW, as a layout mistake would) misses both by far.
  std::vector<Batch> misread = batches;
  for (Batch& b : misread) {
    const Array x = b.x;
    b.x = Array::empty(x.shape(), f32);
    const int64_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
    const float* from = x.data<float>();
    float* to = b.x.data<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t p = 0; p < hw; ++p) to[(i * c + ch) * hw + p] = from[(i * hw + p) * c + ch];
  }
  const Trained wrong = train(start, Device::cpu(), {}, true, misread);
  double mean_wrong = 0;
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    mean_wrong += scaled_error(to_f64(wrong.grads[i]), to_f64(cpu.grads[i]));
  for (size_t i = 0; i < cpu.moved.size(); ++i)
    mean_wrong += scaled_error(wrong.moved[i], cpu.moved[i]);
  mean_wrong /= cpu.grads.size() + cpu.moved.size();
  EXPECT_GT(mean_wrong, std::max(mean_floor, 2 * mean_off))
      << "the input misread: mean error " << mean_wrong;
  std::printf("error against the CPU in f32 over %zu values: largest NHWC %.3g, NCHW %.3g; "
              "mean NHWC %.3g, NCHW %.3g (ratio %.2f), input misread %.3g\n",
              errors.size(), worst_on, worst_off, mean_on, mean_off,
              mean_on / std::max(mean_off, 1e-30), mean_wrong);
}

TEST(CudaChannelsLastTraining, Bf16AutocastStepsMatchNchwAndCpu) {
  REQUIRE_GPU();
  CompileOptions opts;
  opts.autocast = bf16;
  check_step(opts);
}

TEST(CudaChannelsLastTraining, F16AutocastStepsMatchNchwAndCpu) {
  REQUIRE_GPU();
  CompileOptions opts;
  opts.autocast = f16;
  check_step(opts);
}

}  // namespace
}  // namespace kiln
