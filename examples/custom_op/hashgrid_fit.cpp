// Fits a 2-D image with a hash-grid encoding and a small MLP (a NeRF-like field in 2-D), with the
// encoding as a custom op from an op library:
//   kiln_example_hashgrid <path to the hashgrid op library> [--device cpu|cuda] [--steps N]
// First checks the custom op against the same encoding composed from built-in ops (values and
// table gradients), then trains with Adam and prints the PSNR. Exits 1 when a check fails.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "hashgrid.h"

using namespace kiln;

namespace {

// A 64x64 RGB test image with smooth and sharp parts: waves, a disc, a checkerboard.
Array make_image(int64_t side, Array* coords) {
  std::vector<float> rgb, xy;
  for (int64_t v = 0; v < side; ++v)
    for (int64_t u = 0; u < side; ++u) {
      const double x = (u + 0.5) / side, y = (v + 0.5) / side;
      const double disc = (x - 0.6) * (x - 0.6) + (y - 0.4) * (y - 0.4) < 0.05 ? 1.0 : 0.0;
      const double check = (static_cast<int>(x * 8) + static_cast<int>(y * 8)) % 2;
      rgb.push_back(static_cast<float>(0.5 + 0.5 * std::sin(12 * x) * std::cos(9 * y)));
      rgb.push_back(static_cast<float>(disc));
      rgb.push_back(static_cast<float>(0.2 + 0.6 * check));
      xy.push_back(static_cast<float>(x));
      xy.push_back(static_cast<float>(y));
    }
  *coords = Array::from_vector(xy, {side * side, 2});
  return Array::from_vector(rgb, {side * side, 3});
}

Array uniform(std::mt19937& rng, const Shape& s, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(static_cast<size_t>(numel(s)));
  for (auto& e : v) e = d(rng);
  return Array::from_vector(v, s);
}

double max_abs_diff(const Array& a, const Array& b) {
  const Array x = a.to(Device::cpu()), y = b.to(Device::cpu());
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    m = std::max(m, std::abs(double(x.data<float>()[i]) - double(y.data<float>()[i])));
  return m;
}

// Custom against composed on random points: encodings and table gradients.
bool check_against_composed(Device dev, const hashgrid::Config& cfg, std::mt19937& rng) {
  Graph g;
  const int64_t n = 777;
  Tensor x = g.placeholder({n, 2}, f32, "x");
  Tensor table = g.placeholder({cfg.levels, cfg.table_size, cfg.features}, f32, "table");
  Tensor w = g.placeholder({n, cfg.levels * cfg.features}, f32, "w");
  Tensor a = hashgrid::encode_custom(x, table, cfg), b = hashgrid::encode_composed(x, table, cfg);
  Tensor ga = gradients(sum(a * w), {table})[0], gb = gradients(sum(b * w), {table})[0];
  Array xa = uniform(rng, {n, 2}, 0.5);
  for (int64_t i = 0; i < xa.numel(); ++i) xa.data<float>()[i] += 0.5f;
  auto out = g.compile(dev, {}, {a, b, ga, gb})
                 .run({{x, xa},
                       {table, uniform(rng, {cfg.levels, cfg.table_size, cfg.features}, 1)},
                       {w, uniform(rng, {n, cfg.levels * cfg.features}, 1)}});
  const double d_enc = max_abs_diff(out[0], out[1]), d_grad = max_abs_diff(out[2], out[3]);
  std::printf("custom vs composed encoding on %s: max |diff| %.2e (values), %.2e (table grads)\n",
              dev.str().c_str(), d_enc, d_grad);
  return d_enc < 1e-5 && d_grad < 1e-4;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <hashgrid op library> [--device cpu|cuda] [--steps N]\n",
                 argv[0]);
    return 2;
  }
  std::string device = "cpu";
  int steps = 300;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device"))
      device = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
  }
  try {
    load_op_library(argv[1]);
    const Device dev = device == "cuda" ? Device::cuda(0) : Device::cpu();
    hashgrid::Config cfg;
    std::mt19937 rng(7);
    if (!check_against_composed(dev, cfg, rng)) {
      std::fprintf(stderr, "FAILED: the custom op differs from the composed encoding\n");
      return 1;
    }

    const int64_t side = 64, hidden = 32;
    Array coords;
    const Array image = make_image(side, &coords);
    Graph g;
    Tensor x = g.placeholder({side * side, 2}, f32, "x");
    Tensor target = g.placeholder({side * side, 3}, f32, "target");
    const int64_t enc = cfg.levels * cfg.features;
    Tensor table =
        g.variable(uniform(rng, {cfg.levels, cfg.table_size, cfg.features}, 1e-4f), "table");
    Tensor w1 = g.variable(uniform(rng, {enc, hidden}, std::sqrt(6.0f / enc)), "w1");
    Tensor b1 = g.variable(Array::zeros({hidden}, f32), "b1");
    Tensor w2 = g.variable(uniform(rng, {hidden, hidden}, std::sqrt(6.0f / hidden)), "w2");
    Tensor b2 = g.variable(Array::zeros({hidden}, f32), "b2");
    Tensor w3 = g.variable(uniform(rng, {hidden, 3}, std::sqrt(6.0f / hidden)), "w3");
    Tensor b3 = g.variable(Array::zeros({3}, f32), "b3");
    Tensor h = relu(matmul(hashgrid::encode_custom(x, table, cfg), w1) + b1);
    h = relu(matmul(h, w2) + b2);
    Tensor rgb = sigmoid(matmul(h, w3) + b3);
    Tensor loss = mse(rgb, target);
    const std::vector<Tensor> vars = {table, w1, b1, w2, b2, w3, b3};
    auto step = optim::adam(g, vars, gradients(loss, vars), {.lr = 1e-2});
    auto exe = g.compile(dev, {}, {loss}, step);
    const Feeds feeds = {{x, coords}, {target, image}};
    double first = 0, last = 0;
    for (int s = 0; s < steps; ++s) {
      last = exe.run(feeds)[0].to(Device::cpu()).data<float>()[0];
      if (s == 0) first = last;
      if (s % 20 == 0 || s == steps - 1)
        std::printf("step %4d  loss %.5f  psnr %.2f dB\n", s, last, -10 * std::log10(last));
    }
    if (!(last < 0.3 * first)) {
      std::fprintf(stderr, "FAILED: the loss fell only from %.5f to %.5f\n", first, last);
      return 1;
    }
    std::printf("hashgrid fit done: loss %.5f -> %.5f\n", first, last);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
