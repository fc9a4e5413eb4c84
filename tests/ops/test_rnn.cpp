// lstm, gru, rnn and rnn_grad against a float64 reference written here with plain loops (ONNX's
// equations, one batch row and one step at a time), on fresh random data; gradients against
// central differences. Tolerances: f64 1e-9 relative + absolute, f32 2e-5 relative + 1e-5
// absolute (values are O(1); the recurrences are short).
#include <fmt/format.h>

#include <cmath>

#include "core/graph_impl.h"
#include "core/op_id.h"
#include "kiln/ops/rnn.h"
#include "ops/rnn_cases.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using namespace kiln::rnn_test;
using K = RnnActivationKind;

// ---- the reference

double ref_act(const RnnActivation& a, double x) {
  switch (a.kind) {
    case K::sigmoid:
      return 1 / (1 + std::exp(-x));
    case K::tanh:
      return std::tanh(x);
    case K::relu:
      return std::max(x, 0.0);
    case K::affine:
      return a.alpha * x + a.beta;
    case K::leaky_relu:
      return x >= 0 ? x : a.alpha * x;
    case K::thresholded_relu:
      return x > a.alpha ? x : 0;
    case K::scaled_tanh:
      return a.alpha * std::tanh(a.beta * x);
    case K::hard_sigmoid:
      return std::min(1.0, std::max(0.0, a.alpha * x + a.beta));
    case K::elu:
      return x >= 0 ? x : a.alpha * (std::exp(x) - 1);
    case K::softsign:
      return x / (1 + std::fabs(x));
    case K::softplus:
      return std::log(1 + std::exp(x));
  }
  return 0;
}

struct RefOut {
  std::vector<double> y, h, c;  // y in the output layout
};

RefOut reference(const Cfg& c, const Data& data) {
  const int64_t T = c.T, B = c.B, H = c.H, D = c.D(), G = c.G(), GH = G * H;
  const int per_dir = c.cell == RnnCell::lstm ? 3 : c.cell == RnnCell::gru ? 2 : 1;
  std::vector<RnnActivation> acts = c.acts;
  if (acts.empty()) {
    if (c.cell == RnnCell::lstm)
      acts = {{K::sigmoid}, {K::tanh}, {K::tanh}};
    else if (c.cell == RnnCell::gru)
      acts = {{K::sigmoid}, {K::tanh}};
    else
      acts = {{K::tanh}};
  }
  auto clipv = [&](double v) { return c.clip > 0 ? std::min(c.clip, std::max(-c.clip, v)) : v; };
  // x as (T, B, In)
  const std::vector<double> x0 = to_f64(data.arrays[0]);
  int64_t in = c.I;
  std::vector<double> xin(static_cast<size_t>(T * B * in));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < in; ++i)
        xin[(t * B + b) * in + i] = x0[c.batch_first ? (b * T + t) * in + i : (t * B + b) * in + i];
  size_t k = 1 + static_cast<size_t>(c.layers * data.n_layer_inputs);
  std::vector<double> h0, c0;
  if (c.init) {
    h0 = to_f64(data.arrays[k++]);
    if (c.cell == RnnCell::lstm) c0 = to_f64(data.arrays[k++]);
  }
  std::vector<int64_t> lens(static_cast<size_t>(B), T);
  if (c.lens) {
    const auto v = to_f64(data.arrays[k++]);
    for (int64_t b = 0; b < B; ++b) lens[b] = static_cast<int64_t>(v[b]);
  }
  RefOut out;
  std::vector<double> y;
  for (int l = 0; l < c.layers; ++l) {
    const size_t base = 1 + static_cast<size_t>(l * data.n_layer_inputs);
    const auto w = to_f64(data.arrays[base]), r = to_f64(data.arrays[base + 1]);
    const auto bias = c.bias ? to_f64(data.arrays[base + 2]) : std::vector<double>(D * 2 * GH, 0);
    const auto p =
        c.peep ? to_f64(data.arrays[base + 2 + c.bias]) : std::vector<double>(D * 3 * H, 0);
    y.assign(static_cast<size_t>(T * B * D * H), 0);
    for (int64_t d = 0; d < D; ++d) {
      const bool rev = c.dir == RnnDirection::reverse || d == 1;
      // the same list for both directions
      auto A = [&](int64_t i) { return acts[static_cast<size_t>(i % per_dir)]; };
      for (int64_t b = 0; b < B; ++b) {
        std::vector<double> h(H, 0), cs(H, 0);
        const int64_t sidx = (l * D + d) * B + b;
        for (int64_t j = 0; j < H; ++j) {
          if (!h0.empty()) h[j] = h0[sidx * H + j];
          if (!c0.empty()) cs[j] = c0[sidx * H + j];
        }
        for (int64_t s = 0; s < lens[b]; ++s) {
          const int64_t t = rev ? lens[b] - 1 - s : s;
          const double* xt = &xin[(t * B + b) * in];
          // per gate row: x·W + Wb and H·R + Rb
          std::vector<double> xw(GH), hr(GH);
          for (int64_t g = 0; g < GH; ++g) {
            double a = bias[d * 2 * GH + g], e = bias[d * 2 * GH + GH + g];
            for (int64_t i = 0; i < in; ++i) a += w[(d * GH + g) * in + i] * xt[i];
            for (int64_t i = 0; i < H; ++i) e += r[(d * GH + g) * H + i] * h[i];
            xw[g] = a;
            hr[g] = e;
          }
          std::vector<double> hn(H), cn(H);
          if (c.cell == RnnCell::lstm) {
            const double* P = &p[d * 3 * H];
            for (int64_t j = 0; j < H; ++j) {
              const double i_ = ref_act(A(d * 3), clipv(xw[j] + hr[j] + P[j] * cs[j]));
              const double f_ = c.input_forget
                                    ? 1 - i_
                                    : ref_act(A(d * 3), clipv(xw[2 * H + j] + hr[2 * H + j] +
                                                              P[2 * H + j] * cs[j]));
              const double cc = ref_act(A(d * 3 + 1), clipv(xw[3 * H + j] + hr[3 * H + j]));
              cn[j] = f_ * cs[j] + i_ * cc;
              const double o_ = ref_act(A(d * 3), clipv(xw[H + j] + hr[H + j] + P[H + j] * cn[j]));
              hn[j] = o_ * ref_act(A(d * 3 + 2), cn[j]);
            }
          } else if (c.cell == RnnCell::gru) {
            std::vector<double> z(H), rg(H);
            for (int64_t j = 0; j < H; ++j) {
              z[j] = ref_act(A(d * 2), clipv(xw[j] + hr[j]));
              rg[j] = ref_act(A(d * 2), clipv(xw[H + j] + hr[H + j]));
            }
            for (int64_t j = 0; j < H; ++j) {
              double u;
              if (c.lbr) {
                u = xw[2 * H + j] + rg[j] * hr[2 * H + j];
              } else {
                u = xw[2 * H + j] + bias[d * 2 * GH + GH + 2 * H + j];
                for (int64_t i = 0; i < H; ++i) u += r[(d * GH + 2 * H + j) * H + i] * rg[i] * h[i];
              }
              const double hh = ref_act(A(d * 2 + 1), clipv(u));
              hn[j] = (1 - z[j]) * hh + z[j] * h[j];
            }
          } else {
            for (int64_t j = 0; j < H; ++j) hn[j] = ref_act(A(d), clipv(xw[j] + hr[j]));
          }
          h = hn;
          if (c.cell == RnnCell::lstm) cs = cn;
          for (int64_t j = 0; j < H; ++j) y[((t * B + b) * D + d) * H + j] = h[j];
        }
        for (int64_t j = 0; j < H; ++j) {
          out.h.push_back(h[j]);
          if (c.cell == RnnCell::lstm) out.c.push_back(cs[j]);
        }
      }
    }
    in = D * H;
    xin = y;
  }
  // out.h was filled layer, direction, batch, unit: the (L*D, B, H) order
  out.y.resize(y.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < D * H; ++e)
        out.y[c.batch_first ? (b * T + t) * D * H + e : (t * B + b) * D * H + e] =
            y[(t * B + b) * D * H + e];
  return out;
}

void check_forward(const Cfg& c, bool training = false) {
  SCOPED_TRACE(c.str() + (training ? " training" : ""));
  const Data data = make_data(c);
  Graph g;
  std::vector<Tensor> t;
  Feeds feeds;
  for (size_t i = 0; i < data.arrays.size(); ++i) {
    t.push_back(
        g.placeholder(data.arrays[i].shape(), data.arrays[i].dtype(), fmt::format("in{}", i)));
    feeds.emplace_back(t.back(), data.arrays[i]);
  }
  const auto outs = eval(g, build(c, t, training), feeds);
  const RefOut want = reference(c, data);
  const double rtol = c.dtype == f64 ? 1e-9 : 2e-5, atol = c.dtype == f64 ? 1e-9 : 1e-5;
  const int64_t D = c.D();
  expect_close(outs[0], c.batch_first ? Shape{c.B, c.T, D, c.H} : Shape{c.T, c.B, D, c.H}, want.y,
               rtol, atol);
  expect_close(outs[1], {c.layers * D, c.B, c.H}, want.h, rtol, atol);
  if (c.cell == RnnCell::lstm) expect_close(outs[2], {c.layers * D, c.B, c.H}, want.c, rtol, atol);
}

// Every combination of layers, direction, layout, initial state and lengths, f32 and f64.
void sweep(RnnCell cell, const std::function<void(Cfg&)>& tweak = {}) {
  int n = 0;
  for (int layers : {1, 2})
    for (RnnDirection dir :
         {RnnDirection::forward, RnnDirection::reverse, RnnDirection::bidirectional})
      for (bool bf : {false, true})
        for (bool init : {false, true})
          for (bool lens : {false, true}) {
            Cfg c;
            c.cell = cell;
            c.layers = layers;
            c.dir = dir;
            c.batch_first = bf;
            c.init = init;
            c.lens = lens;
            c.dtype = (n++ % 2) ? f32 : f64;
            if (tweak) tweak(c);
            check_forward(c);
          }
}

TEST(Lstm, MatchesReference) { sweep(RnnCell::lstm); }

// Shapes that CUDA's persistent f32 LSTM and GRU (linear_before_reset) kernel takes (H a
// multiple of 4; rnn.cu), in every configuration of the sweep, in inference and in training mode
// (which also writes the reserve), against float64 loops: a batch that is not a multiple of the
// kernel's 4-row tiles, and an H larger than an H200's 132 SMs, so that a CTA runs several units.
// On the CPU these are the CPU kernel's checks on the same shapes.
void sweep_persistent_shapes(RnnCell cell) {
  const ScopedEnv env("KILN_RNN_PERSISTENT", "1");  // (off by default)
  int n = 0;
  sweep(cell, [&](Cfg& c) {
    c.dtype = f32;
    c.lbr = true;
    c.H = 8;
    c.B = 5;
    c.T = 6;
    if (n++ % 2) check_forward(c, true);
  });
  for (int k = 0; k < 3; ++k) {  // H 264: two units a CTA on 132 SMs
    Cfg c;
    c.cell = cell;
    c.dtype = f32;
    c.lbr = true;
    c.H = 264;
    c.B = 3;
    c.T = 3;
    c.layers = k == 1 ? 2 : 1;
    c.dir = k == 0 ? RnnDirection::bidirectional : k == 1 ? RnnDirection::forward
                                                           : RnnDirection::reverse;
    c.batch_first = k == 1;
    c.init = c.lens = k != 1;
    check_forward(c, true);
    check_forward(c);
  }
}

TEST(Gru, PersistentKernelShapesMatchReference) { sweep_persistent_shapes(RnnCell::gru); }

TEST(Lstm, PersistentKernelShapesMatchReference) {
  sweep_persistent_shapes(RnnCell::lstm);
  const ScopedEnv env("KILN_RNN_PERSISTENT", "1");
  Cfg c;
  c.H = 12;
  c.dtype = f32;
  c.peep = c.init = c.lens = true;
  c.clip = 0.7;
  c.dir = RnnDirection::bidirectional;
  check_forward(c, true);
}

// On CUDA the persistent kernel's training layer (outputs, reserve and, through rnn_grad, every
// gradient) against the per-step kernels (KILN_RNN_PERSISTENT=0), at the benchmark's width and
// at 264 units (two a CTA on 132 SMs, padded to four in the backward kernel's tiles).
void check_persistent_equals_per_step(RnnCell cell, int64_t H) {
  Cfg c;
  c.cell = cell;
  c.lbr = true;
  c.dtype = f32;
  c.layers = 2;
  c.init = c.lens = true;
  c.T = 7, c.B = 6, c.I = 16, c.H = H;
  // Weights of [-0.6, 0.6] at 512 units make the recurrence chaotic (pre-activations of about
  // 4 standard deviations): two summation orders of f32 then part by more than any tolerance.
  // A layer's usual initialisation, U(±1/√H), keeps it stable, as trained layers are.
  c.w = 1.0 / std::sqrt(static_cast<double>(H));
  const Data data = make_data(c);
  Graph g;
  std::vector<Tensor> t;
  Feeds feeds;
  for (size_t i = 0; i < data.arrays.size(); ++i) {
    t.push_back(g.placeholder(data.arrays[i].shape(), data.arrays[i].dtype(), fmt::format("in{}", i)));
    feeds.emplace_back(t.back(), data.arrays[i]);
  }
  const std::vector<Tensor> outs = build(c, t, true);
  const Tensor probe = g.constant(random_array(outs[0].shape(), f32));
  Tensor loss = sum(outs[0] * probe) + sum(outs[1]);
  if (outs.size() > 2) loss = loss + sum(outs[2]);
  std::vector<Tensor> wrt(t.begin(), t.end() - 1);  // all but the lengths
  std::vector<Tensor> fetch = outs;
  for (const Tensor& d : gradients(loss, wrt)) fetch.push_back(d);
  std::vector<std::vector<Array>> got;
  for (const bool persistent : {true, false}) {
    CompileOptions o;
    o.kernels.rnn_persistent_forward = o.kernels.rnn_persistent_backward = persistent;
    Executable exe = g.compile(Device::cuda(0), {}, fetch, o);
    std::vector<Array> host;
    for (const Array& a : exe.run(feeds)) host.push_back(a.to(Device::cpu()));
    got.push_back(std::move(host));
  }
  for (size_t i = 0; i < fetch.size(); ++i) {
    SCOPED_TRACE(fmt::format("fetch {}", i));
    expect_close(got[0][i], got[1][i].shape(), to_f64(got[1][i]), 1e-4, 1e-5);
  }
}

TEST(Lstm, CudaPersistentKernelEqualsPerStep) {
  REQUIRE_GPU();
  for (int64_t H : {512, 264}) check_persistent_equals_per_step(RnnCell::lstm, H);
}

TEST(Gru, CudaPersistentKernelEqualsPerStep) {
  REQUIRE_GPU();
  for (int64_t H : {512, 264}) check_persistent_equals_per_step(RnnCell::gru, H);
}

TEST(Lstm, PeepholesClipInputForgetActivations) {
  for (bool input_forget : {false, true})
    for (DType t : {f64, f32}) {
      Cfg c;
      c.peep = true;
      c.clip = 0.7;
      c.input_forget = input_forget;
      c.dtype = t;
      c.lens = c.init = true;
      c.dir = RnnDirection::bidirectional;
      c.acts = {RnnActivation{K::hard_sigmoid, 0.3, 0.45}, RnnActivation{K::scaled_tanh, 0.9, 1.3},
                RnnActivation{K::softsign}};
      check_forward(c);
      c.acts = {RnnActivation{K::sigmoid}, RnnActivation{K::elu, 0.8},
                RnnActivation{K::affine, 0.7, 0.2}};
      c.dir = RnnDirection::reverse;
      c.bias = false;
      check_forward(c);
    }
}

TEST(Lstm, BadShapesAreShapeErrors) {
  Graph g;
  auto x = g.placeholder({4, 2, 5}, f32, "x");
  auto w = g.placeholder({1, 9, 5}, f32, "w");  // 3 gates: not an LSTM
  auto r = g.placeholder({1, 9, 3}, f32, "r");
  expect_error<ShapeError>([&] { lstm(x, {{w, r}}); }, {"[lstm]", "(1, 9, 5)", "(1, 12, 5)"});
  auto w4 = w, r4 = r;
  auto h0 = g.placeholder({1, 3, 3}, f32, "h0");  // B is 2
  expect_error<ShapeError>([&] { gru(x, {{w4, r4}}, h0); }, {"[gru]", "h0"});
  expect_error<ValueError>(
      [&] {
        RnnOptions o;
        o.activations = {RnnActivation{K::tanh}};
        gru(x, {{w4, r4}}, std::nullopt, std::nullopt, o);
      },
      {"[gru]", "activations"});
}

TEST(Lstm, SeqLensOutOfRangeIsAValueError) {
  if (default_device().kind != Device::Kind::cpu)
    GTEST_SKIP() << "the CUDA kernels clamp seq_lens to [0, T] (src/backends/cuda/rnn.cu)";
  Graph g;
  auto x = g.placeholder({3, 2, 2}, f32, "x");
  auto lens = g.placeholder({2}, i64, "lens");
  auto w = g.constant(random_array({1, 8, 2}, f32));
  auto r = g.constant(random_array({1, 8, 2}, f32));
  auto y = lstm(x, {{w, r}}, std::nullopt, std::nullopt, lens).y;
  expect_error<ValueError>(
      [&] {
        eval(g, {y},
             {{x, random_array({3, 2, 2}, f32)}, {lens, Array::from_vector<int64_t>({3, 4}, {2})}});
      },
      {"seq_lens", "4"});
}

// Attributes, optional inputs and the reserve survive a package: a GRU layer with lengths and
// its gradients, saved and loaded, gives the very same values.
TEST(Gru, PackageRoundTrip) {
  Graph g;
  auto x = g.placeholder({4, 2, 3}, f32, "x");
  auto lens = g.placeholder({2}, i32, "lens");
  auto w = g.constant(random_array({2, 6, 3}, f32, -0.5, 0.5));
  auto r = g.constant(random_array({2, 6, 2}, f32, -0.5, 0.5));
  auto b = g.constant(random_array({2, 12}, f32, -0.5, 0.5));
  RnnOptions o;
  o.direction = RnnDirection::bidirectional;
  o.training = true;
  o.clip = 2;
  RnnResult res = gru(x, {{w, r, b, std::nullopt}}, std::nullopt, lens, o);
  auto grads = gradients(sum(res.y), {x, w, r, b});
  std::vector<Tensor> outs{res.y, res.h, res.reserve[0]};
  outs.insert(outs.end(), grads.begin(), grads.end());
  Executable exe = g.compile(Device::cpu(), {}, outs);
  const Array xv = random_array({4, 2, 3}, f32), lv = Array::from_vector<int32_t>({4, 2}, {2});
  const auto want = exe.run(Feeds{{x, xv}, {lens, lv}});
  const std::string path = ::testing::TempDir() + "/kiln_rnn_roundtrip.kiln";
  exe.save(path);
  const auto got = Executable::load(path, Device::cpu()).run({{"x", xv}, {"lens", lv}});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    expect_close(got[i], want[i].shape(), to_f64(want[i]), 0, 0);
}

// torch_rnn_weights against PyTorch's own equations and gate order, written out here
// (nn.LSTM: i, f, g, o; nn.GRU: r, z, n with b_hn inside r * (...)): one bidirectional layer.
std::vector<double> torch_reference(RnnCell cell, const std::vector<std::vector<double>>& p,
                                    const std::vector<double>& x, int64_t T, int64_t B, int64_t I,
                                    int64_t H) {
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  std::vector<double> y(static_cast<size_t>(T * B * 2 * H));
  for (int d = 0; d < 2; ++d) {
    const auto &wih = p[4 * d], &whh = p[4 * d + 1], &bih = p[4 * d + 2], &bhh = p[4 * d + 3];
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> h(H, 0), c(H, 0);
      for (int64_t s = 0; s < T; ++s) {
        const int64_t t = d ? T - 1 - s : s;
        const int64_t G = cell == RnnCell::lstm ? 4 : 3;
        std::vector<double> gi(G * H), gh(G * H);  // W_i* x + b_i*, W_h* h + b_h*
        for (int64_t k = 0; k < G * H; ++k) {
          gi[k] = bih[k];
          gh[k] = bhh[k];
          for (int64_t i = 0; i < I; ++i) gi[k] += wih[k * I + i] * x[(t * B + b) * I + i];
          for (int64_t i = 0; i < H; ++i) gh[k] += whh[k * H + i] * h[i];
        }
        std::vector<double> hn(H);
        for (int64_t j = 0; j < H; ++j) {
          if (cell == RnnCell::lstm) {
            const double ig = sig(gi[j] + gh[j]), fg = sig(gi[H + j] + gh[H + j]),
                         gg = std::tanh(gi[2 * H + j] + gh[2 * H + j]),
                         og = sig(gi[3 * H + j] + gh[3 * H + j]);
            c[j] = fg * c[j] + ig * gg;
            hn[j] = og * std::tanh(c[j]);
          } else {
            const double r = sig(gi[j] + gh[j]), z = sig(gi[H + j] + gh[H + j]);
            const double n = std::tanh(gi[2 * H + j] + r * gh[2 * H + j]);
            hn[j] = (1 - z) * n + z * h[j];
          }
        }
        h = hn;
        for (int64_t j = 0; j < H; ++j) y[((t * B + b) * 2 + d) * H + j] = h[j];
      }
    }
  }
  return y;
}

TEST(Gru, TorchWeightsFollowPyTorchGateOrder) {
  const int64_t T = 4, B = 2, I = 3, H = 2;
  for (RnnCell cell : {RnnCell::lstm, RnnCell::gru}) {
    SCOPED_TRACE(cell == RnnCell::lstm ? "lstm" : "gru");
    const int64_t G = cell == RnnCell::lstm ? 4 : 3;
    Graph g;
    std::vector<Array> arrays;
    std::vector<std::vector<double>> p;
    std::vector<Tensor> wih, whh, bih, bhh;
    for (int d = 0; d < 2; ++d)
      for (const Shape& s : {Shape{G * H, I}, Shape{G * H, H}, Shape{G * H}, Shape{G * H}}) {
        arrays.push_back(random_array(s, f64, -0.7, 0.7));
        p.push_back(to_f64(arrays.back()));
        Tensor t = g.constant(arrays.back());
        const size_t k = (arrays.size() - 1) % 4;
        (k == 0 ? wih : k == 1 ? whh : k == 2 ? bih : bhh).push_back(t);
      }
    const Array xv = random_array({T, B, I}, f64);
    RnnOptions o;
    o.direction = RnnDirection::bidirectional;
    o.linear_before_reset = true;
    const RnnLayerWeights lw = torch_rnn_weights(cell, wih, whh, bih, bhh);
    const Tensor x = g.constant(xv);
    const Tensor y = cell == RnnCell::lstm
                         ? lstm(x, {lw}, std::nullopt, std::nullopt, std::nullopt, o).y
                         : gru(x, {lw}, std::nullopt, std::nullopt, o).y;
    expect_close(eval1(g, y), {T, B, 2, H}, torch_reference(cell, p, to_f64(xv), T, B, I, H), 1e-12,
                 1e-12);
  }
}

TEST(Gru, MatchesReference) { sweep(RnnCell::gru); }

TEST(Gru, LinearBeforeResetBothWays) {
  for (bool lbr : {false, true})
    for (DType t : {f64, f32}) {
      Cfg c;
      c.cell = RnnCell::gru;
      c.lbr = lbr;
      c.dtype = t;
      c.init = c.lens = true;
      c.dir = RnnDirection::bidirectional;
      c.clip = 0.9;
      check_forward(c);
      c.acts = {RnnActivation{K::leaky_relu, 0.1}, RnnActivation{K::softplus}};
      c.layers = 2;
      c.batch_first = true;
      check_forward(c);
    }
}

TEST(Rnn, MatchesReference) { sweep(RnnCell::rnn); }

TEST(Rnn, Activations) {
  for (RnnActivation a : {RnnActivation{K::relu}, RnnActivation{K::thresholded_relu, 0.2},
                          RnnActivation{K::sigmoid}, RnnActivation::of(K::hard_sigmoid)}) {
    Cfg c;
    c.cell = RnnCell::rnn;
    c.acts = {a};
    c.init = true;
    c.dir = RnnDirection::bidirectional;
    check_forward(c);
  }
}

// ---- rnn_grad (finite-difference checks of every input: tests/autodiff/test_rnn_grad.cpp)

TEST(RnnGrad, OnlyHiddenStateOutputUsed) {
  // a loss on h alone: y's cotangent is zeros
  Cfg c;
  c.cell = RnnCell::gru;
  c.init = true;
  c.dtype = f64;
  const Data data = make_data(c);
  check_gradients(
      [&](Graph&, const std::vector<Tensor>& t) { return std::vector<Tensor>{build(c, t)[1]}; },
      data.arrays);
}

// A training layer's gradient reads its own reserve: one lstm node in the graph; without
// training, the gradient adds a training twin. Both give the same gradient.
TEST(RnnGrad, ReusesTheTrainingReserve) {
  const Array xv = random_array({3, 2, 2}, f32), wv = random_array({1, 8, 2}, f32),
              rv = random_array({1, 8, 2}, f32);
  std::vector<Array> dx;
  for (bool training : {true, false}) {
    Graph g;
    auto x = g.placeholder({3, 2, 2}, f32, "x");
    RnnOptions o;
    o.training = training;
    RnnResult res =
        lstm(x, {{g.constant(wv), g.constant(rv)}}, std::nullopt, std::nullopt, std::nullopt, o);
    auto d = gradients(sum(res.y), {x})[0];
    int lstm_nodes = 0, grad_nodes = 0;
    for (const auto& n : g.impl().nodes) {
      lstm_nodes += n.op == OpId::Lstm;
      grad_nodes += n.op == OpId::RnnGrad;
    }
    EXPECT_EQ(lstm_nodes, training ? 1 : 2);
    EXPECT_EQ(grad_nodes, 1);
    dx.push_back(eval(g, {d}, {{x, xv}}, {.optimize = false})[0]);
  }
  expect_close(dx[1], {3, 2, 2}, to_f64(dx[0]), 0, 0);
}

}  // namespace
}  // namespace kiln
