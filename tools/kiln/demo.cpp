// `kiln demo`: the main job. Builds a small convolutional network with the C++ API, compiles it
// for the default device, runs batches through it and reports what it did and how long it took.
// (Training replaces inference here once autodiff and optimizers exist.)
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>

#include "kiln/kiln.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Array random_weights(const Shape& shape, double fan_in, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
  Array a = Array::empty(shape, f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = d(rng);
  return a;
}

struct DemoOptions {
  int steps = 5;
  int batch = 64;
};

void run_demo(const DemoOptions& o) {
  using clock = std::chrono::steady_clock;
  const Device dev = default_device();
  fmt::print("kiln {} demo: a small convnet on {}\n", version(), dev.str());
  std::mt19937 rng(2026);

  auto t0 = clock::now();
  Graph g;
  auto images = g.placeholder({-1, 1, 28, 28}, f32, "images");
  ConvOptions same;
  same.padding = {1, 1};
  PoolOptions pool2;
  pool2.kernel = {2, 2};
  auto w1 = g.constant(random_weights({16, 1, 3, 3}, 9, rng));
  auto b1 = g.constant(Array::zeros({16}, f32));
  auto w2 = g.constant(random_weights({32, 16, 3, 3}, 144, rng));
  auto b2 = g.constant(Array::zeros({32}, f32));
  auto wf = g.constant(random_weights({10, 32 * 7 * 7}, 32 * 7 * 7, rng));
  auto bf = g.constant(Array::zeros({10}, f32));
  Tensor h = max_pool(relu(conv2d(images, w1, b1, same)), pool2);      // (N, 16, 14, 14)
  h = max_pool(relu(conv2d(h, w2, b2, same)), pool2);                 // (N, 32, 7, 7)
  h = reshape(h, {-1, 32 * 7 * 7});
  auto logits = linear(h, wf, bf);                                    // (N, 10)
  auto probs = softmax(logits);
  auto predicted = argmax(probs, -1);
  fmt::print("built a graph of {} nodes in {:.2f} ms\n", g.num_nodes(), ms_since(t0));

  t0 = clock::now();
  auto exe = g.compile(dev, {{images, {o.batch, 1, 28, 28}}}, {probs, predicted});
  fmt::print("compiled for batch {}: {} kernels, {:.1f} KiB of intermediates, in {:.2f} ms\n",
             o.batch, exe.num_steps(), exe.peak_intermediate_bytes() / 1024.0, ms_since(t0));

  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Array batch = Array::empty({o.batch, 1, 28, 28}, f32);
  double total_ms = 0;
  for (int s = 0; s < o.steps; ++s) {
    float* p = batch.data<float>();
    for (int64_t i = 0; i < batch.numel(); ++i) p[i] = pixel(rng);
    t0 = clock::now();
    auto out = exe.run({{images, batch}});
    const double ms = ms_since(t0);
    total_ms += ms;
    // each row of probabilities sums to one: a cheap self-check of the whole pipeline
    auto pr = out[0].to_vector<float>();
    double worst = 0;
    for (int64_t r = 0; r < o.batch; ++r) {
      double sum = 0;
      for (int c = 0; c < 10; ++c) sum += pr[r * 10 + c];
      worst = std::max(worst, std::fabs(sum - 1.0));
    }
    if (worst > 1e-4) throw Error(fmt::format("[demo] probabilities sum to 1 +- {}", worst));
    fmt::print("batch {}: {} images in {:.3f} ms ({:.0f} images/s), first prediction {}\n", s,
               o.batch, ms, o.batch / ms * 1e3, out[1].to_vector<int64_t>()[0]);
  }
  fmt::print("demo done: {} batches, {:.3f} ms per batch on {}\n", o.steps, total_ms / o.steps,
             dev.str());
}
}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Build, compile and run a small convnet");
  static DemoOptions opts;
  cmd->add_option("--steps", opts.steps, "Number of batches")->check(CLI::Range(1, 100000));
  cmd->add_option("--batch", opts.batch, "Batch size")->check(CLI::Range(1, 4096));
  cmd->callback([] { run_demo(opts); });
}

}  // namespace kiln::cli
